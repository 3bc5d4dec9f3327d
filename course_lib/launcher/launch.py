"""Run a function on a multi-process gloo or NCCL group, straight from a notebook cell.

    results = launch(fn, *args, world_size=2, backend="gloo", timeout=300, **kwargs)
    results[r]  # what fn returned on rank r

Why not ``torch.multiprocessing.spawn``: it cannot start a function defined in a notebook, its children
print to the terminal rather than the cell, a failing rank leaves its peers blocked in a collective, and
every launch pays ``import torch`` again. Here:

* ``fn`` travels by value (cloudpickle): a lambda or a closure over notebook variables works, and a
  function changed in the notebook runs as changed.
* ranks start from a fork server that has torch (then torchrec) imported already, so the second and later
  launches from a kernel skip those imports; it never initialises CUDA, so ranks may use GPUs.
* each rank's stdout/stderr stream live into the cell, prefixed ``[rank N]``.
* a rank that raises ends the launch at once with a :class:`LaunchError` that carries every failed rank's
  remote traceback; ``timeout`` ends a hung launch and names the ranks that never finished; Ctrl-C ends
  every rank; nothing (process or temporary file) outlives the call.
* the group meets through a FileStore in a private folder and gloo/NCCL talk over loopback only.

Each rank gets the torchrun environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ...), so a function that
runs here runs unchanged under ``torchrun`` via ``python -m course_lib.run MODULE:FUNCTION``.
"""
from __future__ import annotations

import atexit
import json
import linecache
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import cloudpickle

from course_lib.launcher import _pickling, _rank

__all__ = [
    "launch",
    "LaunchError",
    "RankFailure",
    "default_backend",
    "lab_backend",
    "resolve_backend",
    "check_nccl",
    "device_for",
    "rank_device",
    "group_never_formed",
]

BACKENDS = ("gloo", "nccl", "auto")
START_METHODS = ("forkserver", "spawn", "fork")
# A kernel's first launch forks from a server that imported torch only (as fast as it gets cold); right
# after it, a second server that also imports torchrec warms up in the background and takes over once
# ready. So no launch waits for an import it may not need, and later ones pay for none.
PRELOAD_FIRST = ("torch", "torch.distributed")
PRELOAD_FULL = (*PRELOAD_FIRST, "torchrec", "torchrec.distributed")
_TERMINATE_GRACE_S = 2.0
_FAILURE_GRACE_S = 0.25  # let peers that fail at the same moment report before they are terminated
_POLL_S = 0.005
# A launch whose ranks all failed while creating the process group (before the learner's function ran) is
# started again, with a fresh rendezvous, up to this many times in all: gloo's full-mesh connect over
# loopback fails now and then ("Gloo connectFullMesh failed ... Connection closed by peer", pytorch #53270).
GROUP_ATTEMPTS = 3
_ELASTIC_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT") if hasattr(signal, n))

device_for = _rank.device_for
rank_device = _rank.rank_device


@dataclass
class RankFailure:
    """How one rank failed: its exception and remote traceback, or how its process ended."""

    rank: int
    kind: str  # "raised" | "exited" | "timed out" | "terminated"
    exc_type: str = ""
    message: str = ""
    traceback: str = ""
    exit_code: int | None = None
    exception: BaseException | None = field(default=None, repr=False)
    after: int | None = None  # the rank whose failure came first, when this one followed it
    phase: str = ""  # where a rank that raised was: "setup", "group" (creating the process group), "function"
    seen_at: float = field(default_factory=time.time, repr=False)  # when the launcher saw it (wall clock)

    def headline(self) -> str:
        later = f" (after rank {self.after} failed)" if self.after is not None else ""
        if self.kind == "raised":
            message = self.message.strip().splitlines()[0] if self.message.strip() else ""
            if len(message) > 160:
                message = message[:157] + "..."
            return f"rank {self.rank} raised {self.exc_type}: {message}{later}"
        if self.kind == "exited":
            how = _describe_exit(self.exit_code)
            return f"rank {self.rank} {how} without returning a result{later}"
        if self.kind == "timed out":
            return f"rank {self.rank} never finished"
        return f"rank {self.rank} was terminated"


class LaunchError(RuntimeError):
    """A launch failed: one or more ranks raised, died, or did not finish within the timeout.

    ``failures`` lists the ranks that failed (the first to fail first); ``results`` holds what the ranks
    that did finish returned (None for the others).
    """

    def __init__(self, summary: str, failures: Sequence[RankFailure], results: list[Any]) -> None:
        self.summary = summary
        self.failures = list(failures)
        self.results = results
        super().__init__(self._render())

    @property
    def failed_ranks(self) -> list[int]:
        return [f.rank for f in self.failures if f.kind in ("raised", "exited")]

    def _render_traceback_(self) -> list[str]:
        """How IPython shows it: the ranks' story, without the launcher's own frames."""
        return [f"LaunchError: {self}"]

    def _render(self) -> str:
        lines = [self.summary]
        for failure in self.failures:
            lines.append(f"  - {failure.headline()}")
        for failure in self.failures:
            if failure.traceback:
                lines.append(f"\n--- remote traceback of rank {failure.rank} ---")
                lines.append(failure.traceback.rstrip())
        return "\n".join(lines)


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "ended"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = " (out of memory?)" if name == "SIGKILL" else ""
        return f"was killed by {name}{hint}"
    return f"exited with code {code}"


# --------------------------------------------------------------------------------------------- preflight


def _torch_version() -> str:
    import torch

    return torch.__version__


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def check_nccl(world_size: int, gpu_count: int | None = None) -> None:
    """Raise a clear error unless there is one CUDA GPU per rank (NCCL's requirement here)."""
    found = _gpu_count() if gpu_count is None else gpu_count
    if found >= world_size:
        return
    if found == 0:
        why = f"found no CUDA GPU (torch {_torch_version()})"
    else:
        why = f"found {found} CUDA GPU{'s' if found != 1 else ''}"
    raise ValueError(
        f"backend='nccl' needs one GPU per rank: world_size={world_size} but {why}. "
        "Use backend='gloo' (CPU) or backend='auto', or lower world_size."
    )


def resolve_backend(backend: str, world_size: int, gpu_count: int | None = None) -> str:
    """Turn ``"auto"`` into ``"nccl"`` (one GPU per rank available) or ``"gloo"``; check ``"nccl"``."""
    if backend == "auto":
        found = _gpu_count() if gpu_count is None else gpu_count
        return "nccl" if found >= world_size else "gloo"
    if backend == "nccl":
        check_nccl(world_size, gpu_count)
    return backend


def default_backend(world_size: int, gpu_count: int | None = None) -> str:
    """The backend of a launch that names none: ``$COURSE_BACKEND`` when set, else ``"gloo"``.

    ``COURSE_BACKEND=nccl`` (what ``make test-gpu`` sets) runs every lab's launches on NCCL unchanged; a
    launch with more ranks than the machine has GPUs then runs on gloo, and says so once per kernel.
    """
    chosen = os.environ.get("COURSE_BACKEND", "").strip().lower() or "gloo"
    if chosen not in BACKENDS:
        raise ValueError(f"COURSE_BACKEND={chosen!r} is not a backend; set it to one of {', '.join(BACKENDS)}")
    if chosen == "nccl":
        found = _gpu_count() if gpu_count is None else gpu_count
        if found < world_size:
            if world_size not in _SAID_FALLBACK:
                _SAID_FALLBACK.add(world_size)
                print(f"launch: COURSE_BACKEND=nccl, but {world_size} ranks need {world_size} GPUs and there are "
                      f"{found}: launches of {world_size} ranks run on gloo.", file=sys.stderr)
            return "gloo"
    return chosen


_SAID_FALLBACK: set[int] = set()


def lab_backend(world_size: int, gpu_count: int | None = None) -> str:
    """The backend of a lab that uses GPUs when it has them: ``$COURSE_BACKEND`` when set (as
    :func:`default_backend`), else NCCL when there is a GPU per rank, else gloo (``"auto"``)."""
    if os.environ.get("COURSE_BACKEND", "").strip():
        return default_backend(world_size, gpu_count)
    return resolve_backend("auto", world_size, gpu_count)


def _log_backend(backend: str, world_size: int) -> None:
    """Append this launch's backend to ``$COURSE_BACKEND_LOG`` when set (``make test-gpu`` tallies them)."""
    path = os.environ.get("COURSE_BACKEND_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"backend": backend, "world_size": world_size}) + "\n")


def _validate(fn: Any, world_size: Any, backend: Any, timeout: Any, start_method: Any) -> None:
    if not callable(fn):
        raise TypeError(f"launch() needs a function to run on every rank; got {type(fn).__name__} {fn!r:.60}")
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise TypeError(f"world_size must be an int (the number of ranks); got {type(world_size).__name__}")
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1; got {world_size}")
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(map(repr, BACKENDS))}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds; got {timeout!r}")
    if start_method not in START_METHODS:
        raise ValueError(
            f"unknown start_method {start_method!r}; choose one of {', '.join(map(repr, START_METHODS))}"
        )
    if start_method == "fork":
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            raise RuntimeError(
                "start_method='fork' is unsafe once CUDA is initialised in this kernel (forked ranks would "
                "inherit a broken CUDA context). Use start_method='forkserver' (the default) or 'spawn', "
                "or restart the kernel."
            )


def _unpicklable_part(fn: Callable[..., Any], args: tuple, kwargs: dict) -> str:
    """Name the first piece of a launch that cloudpickle cannot ship, for the error message."""

    def fails(obj: Any) -> Exception | None:
        try:
            _pickling.dumps(obj)
        except Exception as exc:  # noqa: BLE001
            return exc
        return None

    for i, arg in enumerate(args):
        if (exc := fails(arg)) is not None:
            return f"positional argument {i} ({type(arg).__name__}) cannot be pickled: {exc}"
    for key, value in kwargs.items():
        if (exc := fails(value)) is not None:
            return f"keyword argument {key!r} ({type(value).__name__}) cannot be pickled: {exc}"
    code = getattr(fn, "__code__", None)
    if code is not None:
        closure = dict(zip(code.co_freevars, [c.cell_contents for c in (fn.__closure__ or ())]))
        globals_ = {n: fn.__globals__[n] for n in code.co_names if n in getattr(fn, "__globals__", {})}
        for name, value in {**closure, **globals_}.items():
            if (exc := fails(value)) is not None:
                return (
                    f"the function refers to {name!r} ({type(value).__name__}), which cannot be pickled: {exc}. "
                    "Create it inside the function instead"
                )
    exc = fails(fn)
    return f"the function {getattr(fn, '__name__', fn)!r} cannot be pickled: {exc}"


def _free_port() -> int:
    """A free loopback port for MASTER_PORT (torchrun code may read it; the launch itself uses a FileStore)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------------------- processes


class _ForkServer:
    """The kernel's preloading fork server (course_lib.launcher._zygote); started on first use."""

    def __init__(self, preload: Sequence[str]) -> None:
        self.preload = tuple(preload)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        # importing torchrec asks torch.cuda.is_available() (fbgemm_gpu/__init__.py); on a CUDA build that starts
        # the CUDA driver in the server, and a rank forked from it could not use a GPU. Asked through NVML, the
        # question leaves CUDA untouched ("will NOT poison fork", torch.cuda.is_available's docstring)
        env.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "course_lib.launcher._zygote", *self.preload],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            start_new_session=True,  # a notebook interrupt (SIGINT to the kernel's group) must not hit it
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.wfd = self.proc.stdin.fileno()
        self.rfd = self.proc.stdout.fileno()
        os.set_blocking(self.rfd, False)
        self.buffer = b""
        self.ready = False
        self.started: dict[str, dict[int, int]] = {}  # workdir -> rank -> pid
        self.exits: dict[int, int] = {}  # pid -> exit code, until its owner collects it
        self.live: set[int] = set()  # pids forked and not yet exited

    def alive(self) -> bool:
        return self.proc.poll() is None

    def send(self, message: dict[str, Any]) -> None:
        os.write(self.wfd, (json.dumps(message) + "\n").encode())

    def read_events(self, timeout: float) -> None:
        """Take in what the server reported within `timeout` seconds (returns as soon as anything came).

        Several users share one server (a launch, live ranks), so news is filed by work folder and pid
        rather than handed to whoever reads first.
        """
        readable, _, _ = select.select([self.rfd], [], [], timeout)
        if not readable:
            return
        try:
            chunk = os.read(self.rfd, 65536)
        except BlockingIOError:
            return
        if not chunk and self.proc.poll() is not None:
            raise RuntimeError("the launcher's fork server died; the next launch starts a new one")
        self.buffer += chunk
        while b"\n" in self.buffer:
            line, self.buffer = self.buffer.split(b"\n", 1)
            event = json.loads(line)
            if event["event"] == "ready":
                self.ready = True
            elif event["event"] == "started":
                self.started.setdefault(event["workdir"], {})[int(event["rank"])] = int(event["pid"])
                self.live.add(int(event["pid"]))
            elif event["event"] == "exit":
                self.exits[int(event["pid"])] = int(event["code"])
                self.live.discard(int(event["pid"]))

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.terminate()
                self.proc.wait(timeout=3)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                self.proc.kill()
                self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass


_server: _ForkServer | None = None  # serves launches now
_successor: _ForkServer | None = None  # the fully preloaded server, warming up
_retired: list[_ForkServer] = []  # replaced servers whose ranks (live Ranks) still run
_server_lock = threading.RLock()


def _retire(server: _ForkServer) -> None:
    """Close a replaced server once no rank it forked is alive (closing it kills its ranks)."""
    try:
        server.read_events(0)
    except RuntimeError:
        pass
    if server.live and server.alive():
        _retired.append(server)
    else:
        server.close()


def _fork_server() -> _ForkServer:
    """The server to fork ranks from: the successor once it is ready, else the current one."""
    global _server, _successor
    for old in list(_retired):
        _retired.remove(old)
        _retire(old)
    if _successor is not None:
        try:
            _successor.read_events(0)
        except RuntimeError:
            _successor.close()
            _successor = None
        if _successor is not None and _successor.ready:
            if _server is not None:
                _retire(_server)
            _server, _successor = _successor, None
    if _server is None or not _server.alive():
        if _server is not None:
            _server.close()
        _server = _ForkServer(PRELOAD_FIRST)
    return _server


def _warm_up_successor() -> None:
    """After a launch from the torch-only server, start the fully preloaded one in the background."""
    global _successor
    if _server is not None and _server.preload != PRELOAD_FULL and _successor is None:
        _successor = _ForkServer(PRELOAD_FULL)


def shutdown_fork_server() -> None:
    """Stop this kernel's fork servers (the next launch starts afresh)."""
    global _server, _successor
    with _server_lock:
        for server in (_server, _successor, *_retired):
            if server is not None:
                server.close()
        _server = _successor = None
        _retired.clear()


atexit.register(shutdown_fork_server)


class _Ranks:
    """The rank processes of one launch, whichever way they were started; polls their exits."""

    def __init__(self, method: str, workdir: str, world_size: int) -> None:
        self.pcontext: Any = None  # torch.distributed.elastic's PContext, for the spawn method
        self.method = method
        self.workdir = workdir
        self.pids: dict[int, int] = {}  # rank -> pid
        self.exit_codes: dict[int, int] = {}  # rank -> code
        self.popens: dict[int, subprocess.Popen] = {}
        self.server: _ForkServer | None = None
        if method == "forkserver":
            self.server = _fork_server()
            self.server.send({"cmd": "spawn", "workdir": workdir, "ranks": list(range(world_size))})
            deadline = time.monotonic() + 120  # first start imports torch
            try:
                while len(self.server.started.get(workdir, {})) < world_size:
                    if time.monotonic() > deadline:
                        raise RuntimeError("the launcher's fork server did not start the ranks within 120 s")
                    self.server.read_events(0.05)
                self.pids = self.server.started.pop(workdir)
            except BaseException:
                shutdown_fork_server()  # takes any rank it did start with it
                raise
        elif method == "spawn":
            # torch's own process layer (what torchrun runs ranks with): a fresh interpreter per rank.
            from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, start_processes

            kept = {sig: signal.getsignal(sig) for sig in _ELASTIC_SIGNALS}
            self.pcontext = start_processes(
                name="course-launch",
                entrypoint=sys.executable,
                args={r: ("-c", _rank.SPAWN_CODE, workdir, str(r)) for r in range(world_size)},
                envs={r: {} for r in range(world_size)},
                logs_specs=DefaultLogsSpecs(log_dir=os.path.join(workdir, "elastic")),
                start_method="spawn",
            )
            if threading.current_thread() is threading.main_thread():
                # PContext.start() turns SIGINT into its own exception; a notebook interrupt must stay a
                # KeyboardInterrupt (launch() then ends the ranks itself).
                for sig, handler in kept.items():
                    if handler is not None:
                        signal.signal(sig, handler)
            for rank, handler in self.pcontext.subprocess_handlers.items():
                self.popens[rank] = handler.proc
                self.pids[rank] = handler.proc.pid
        else:  # fork straight from this process (CPU only; checked in _validate)
            for rank in range(world_size):
                pid = os.fork()
                if pid == 0:
                    code = 1
                    try:
                        os.setsid()
                        _rank.set_parent_death_signal(signal.SIGKILL)
                        code = _rank.main(workdir, rank)
                    finally:
                        os._exit(code)
                self.pids[rank] = pid

    def running(self) -> list[int]:
        return [r for r in self.pids if r not in self.exit_codes]

    def poll(self, wait: float) -> None:
        """Record ranks that exited, waiting up to `wait` seconds for news."""
        if self.server is not None:
            self.server.read_events(wait)
            for rank in self.running():
                code = self.server.exits.pop(self.pids[rank], None)
                if code is not None:
                    self.exit_codes[rank] = code
            return
        time.sleep(wait)
        for rank in self.running():
            if rank in self.popens:
                code = self.popens[rank].poll()
                if code is not None:
                    self.exit_codes[rank] = code
            else:
                pid, status = os.waitpid(self.pids[rank], os.WNOHANG)
                if pid:
                    self.exit_codes[rank] = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)

    def signal(self, ranks: Iterable[int], sig: int) -> None:
        """Send `sig` to each running rank and to everything in its session."""
        for rank in ranks:
            if rank not in self.exit_codes:
                _signal_session(self.pids[rank], sig)

    def end_sessions(self) -> None:
        """Kill whatever the ranks started that outlived them (each rank leads a session of its own)."""
        for pid in self.pids.values():
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def terminate(self, ranks: Iterable[int], on_wait: Callable[[], None]) -> None:
        """SIGTERM, then SIGKILL after a grace period; returns once every one of `ranks` has exited."""
        ranks = [r for r in ranks if r not in self.exit_codes]
        self.signal(ranks, signal.SIGTERM)
        deadline = time.monotonic() + _TERMINATE_GRACE_S
        killed = False
        while any(r not in self.exit_codes for r in ranks):
            if not killed and time.monotonic() > deadline:
                self.signal(ranks, signal.SIGKILL)
                killed = True
            if self.server is not None and not self.server.alive():
                break  # its ranks died with it (parent-death signal)
            self.poll(_POLL_S)
            on_wait()

    def close(self) -> None:
        """End what the ranks left running and release what the process layer holds (its log files); every
        rank has exited by now."""
        self.end_sessions()
        if self.pcontext is not None:
            self.pcontext.close(death_sig=signal.SIGKILL, timeout=1)


def _signal_session(pid: int, sig: int) -> None:
    """`sig` to the session that rank `pid` leads (the rank and what it started), or to the rank alone when
    it has not made its session yet."""
    for send in (os.killpg, os.kill):
        try:
            send(pid, sig)
            return
        except (ProcessLookupError, PermissionError):
            continue


# ---------------------------------------------------------------------------------------------- output


class _OutputPump:
    """Tails each rank's stdout/stderr files and writes complete lines into this process's streams.

    A rank's stderr is held back until its process group has formed (``_rank.group_marker_path``): when the
    rendezvous fails and the launch starts the ranks again, what they printed meanwhile (gloo's C++ log of the
    failed connect) is dropped with :meth:`settle` instead of reaching the cell as if something were wrong.
    """

    def __init__(self, workdir: str, world_size: int, show: set[int] | None) -> None:
        from course_lib.launcher.progress import ProgressReader

        self.workdir = workdir
        self.formed: set[int] = set()
        self.held: dict[int, list[str]] = {rank: [] for rank in range(world_size)}
        self.progress = ProgressReader(workdir)
        self.files = [
            (rank, stream, _rank.output_path(workdir, rank, stream))
            for rank in range(world_size)
            for stream in ("out", "err")
        ]
        self.offsets = {(rank, stream): 0 for rank, stream, _ in self.files}
        self.partial = {(rank, stream): "" for rank, stream, _ in self.files}
        self.show = show
        self.width = len(str(world_size - 1))

    def pump(self, final: bool = False) -> None:
        self.progress.poll()
        if final:
            self.progress.close()
        for rank, stream, path in self.files:
            key = (rank, stream)
            try:
                with open(path, "rb") as f:
                    f.seek(self.offsets[key])
                    data = f.read()
            except FileNotFoundError:
                continue
            if not data:
                if final and self.partial[key]:
                    self._emit(rank, stream, [self.partial[key]])
                    self.partial[key] = ""
                continue
            self.offsets[key] += len(data)
            text = self.partial[key] + data.decode("utf-8", errors="replace")
            lines = text.split("\n")
            self.partial[key] = lines.pop()
            if final and self.partial[key]:
                lines.append(self.partial[key])
                self.partial[key] = ""
            self._emit(rank, stream, lines)

    def _emit(self, rank: int, stream: str, lines: list[str]) -> None:
        if stream == "err" and rank not in self.formed:
            if os.path.exists(_rank.group_marker_path(self.workdir, rank)):
                self.formed.add(rank)
                lines, self.held[rank] = self.held[rank] + lines, []
            else:
                self.held[rank].extend(lines)
                return
        if not lines or (self.show is not None and rank not in self.show):
            return
        out = sys.stdout if stream == "out" else sys.stderr
        out.write("".join(f"[rank {rank:>{self.width}}] {line}\n" for line in lines))
        out.flush()

    def settle(self, drop: bool = False) -> None:
        """At the end of a launch: show the stderr still held back (a rank that failed before its group
        formed), or `drop` it when the launch is about to be started again."""
        for rank, lines in self.held.items():
            self.held[rank] = []
            if lines and not drop:
                self.formed.add(rank)
                self._emit(rank, "err", lines)


# ---------------------------------------------------------------------------------------------- launch


def launch(
    fn: Callable[..., Any],
    *args: Any,
    world_size: int = 2,
    backend: str | None = None,
    timeout: float = 300,
    start_method: str = "forkserver",
    init_process_group: bool = True,
    show_ranks: Iterable[int] | None = None,
    **kwargs: Any,
) -> list[Any]:
    """Run ``fn(*args, **kwargs)`` on `world_size` ranks and return what each rank returned, by rank.

    Args:
        fn: any callable, also one defined in the notebook (a lambda, a closure): it travels by value.
        world_size: number of ranks (processes).
        backend: ``"gloo"`` (CPU), ``"nccl"`` (one GPU per rank; rank r uses ``cuda:r``) or ``"auto"``
            (nccl when there is a GPU per rank, else gloo; says which it chose). None (the default): the
            course-wide switch ``COURSE_BACKEND`` (see :func:`default_backend`), else ``"gloo"``.
        timeout: seconds before a launch that has not finished is ended (also the collectives' timeout).
        start_method: ``"forkserver"`` (default: forks from a server with torch and torchrec preloaded,
            CUDA-safe), ``"spawn"`` (a fresh interpreter per rank), or ``"fork"`` (from this process: fast,
            CPU only, refused once CUDA is initialised here).
        init_process_group: False leaves the process group to `fn` (for the lab that teaches it); the
            torchrun variables are set either way.
        show_ranks: the ranks whose output reaches the cell (default: all).

    Raises:
        LaunchError: a rank raised or died (with every failed rank's remote traceback), or the launch
            outran `timeout` (naming the ranks that never finished).
        TypeError / ValueError: bad arguments, at once, before any process starts.
    """
    if backend is None:
        backend = default_backend(world_size)
    _validate(fn, world_size, backend, timeout, start_method)
    if backend in ("auto", "nccl"):
        chosen = resolve_backend(backend, world_size)
        if backend == "auto":
            print(f"launch: backend='auto' chose {chosen!r} ({_gpu_count()} CUDA GPUs for {world_size} ranks)")
        backend = chosen
    _log_backend(backend, world_size)
    cores = os.cpu_count() or 1
    if backend == "gloo" and world_size > cores:
        warnings.warn(
            f"launch: {world_size} ranks on {cores} CPU cores; they will take turns on the cores "
            "(fine for learning, misleading for timing).",
            stacklevel=2,
        )
    header = {
        "world_size": world_size,
        "backend": backend,
        "timeout_s": float(timeout),
        "init_group": bool(init_process_group),
        "sys_path": [p for p in sys.path if p],
        "cwd": os.getcwd(),
    }
    try:
        body = _pickling.dumps((fn, args, kwargs))
    except Exception:
        raise TypeError(f"launch() cannot ship this call to the ranks: {_unpicklable_part(fn, args, kwargs)}") from None

    saved_handlers = {sig: signal.getsignal(sig) for sig in _ELASTIC_SIGNALS}
    sources = _source_map(fn)
    try:
        for attempt in range(1, GROUP_ATTEMPTS + 1):
            workdir = tempfile.mkdtemp(prefix="course-launch-")  # mode 0700: private to this user
            try:
                with open(os.path.join(workdir, _rank.PAYLOAD), "wb") as f:
                    f.write(_pickling.dumps({**header, "master_port": _free_port()}))
                    f.write(body)
                with _server_lock:
                    try:
                        return _run(workdir, world_size, float(timeout), start_method, show_ranks, sources,
                                    retry_allowed=init_process_group and attempt < GROUP_ATTEMPTS)
                    except LaunchError as error:
                        if attempt == GROUP_ATTEMPTS or not init_process_group or not group_never_formed(error):
                            raise
                        notice(
                            f"launch: the process group did not form ({error.failures[0].headline()}); "
                            f"starting the ranks again with a fresh rendezvous (attempt {attempt + 1} of {GROUP_ATTEMPTS})."
                        )
                    finally:
                        if start_method == "forkserver":
                            _warm_up_successor()
            finally:
                shutil.rmtree(workdir, ignore_errors=True)
        raise AssertionError("unreachable: the last attempt returns or raises")
    finally:
        if threading.current_thread() is threading.main_thread():
            for sig, handler in saved_handlers.items():
                if signal.getsignal(sig) is not handler and handler is not None:
                    signal.signal(sig, handler)


def notice(message: str) -> None:
    """Say ``message`` in one line on the cell's stderr, or, when ``$COURSE_LAUNCH_NOTICES`` names a file,
    append it there instead: under nbval (the repository's conftest sets it) a launch that had to start its
    group again must not add an output that the stored notebook does not have."""
    path = os.environ.get("COURSE_LAUNCH_NOTICES")
    if path:
        with open(path, "a") as f:
            f.write(message + "\n")
    else:
        print(message, file=sys.stderr, flush=True)


def group_never_formed(error: "LaunchError") -> bool:
    """Whether a failed launch failed because its process group did not form: the first rank to fail raised
    while creating it (gloo's loopback connect fails now and then: one rank's connect can fail while its
    peer's succeeds), and the launch did not time out. What failed after it failed because of it. Such a
    launch may be started again; one whose first failure is in the learner's function never is."""
    if not error.failures or any(f.kind == "timed out" for f in error.failures):
        return False
    first = error.failures[0]
    return first.kind == "raised" and first.phase == "group"


def _read_result(workdir: str, rank: int) -> tuple[str, Any] | None:
    try:
        with open(_rank.result_path(workdir, rank), "rb") as f:
            return cloudpickle.load(f)
    except FileNotFoundError:
        return None


def _run(
    workdir: str,
    world_size: int,
    timeout: float,
    start_method: str,
    show_ranks: Iterable[int] | None,
    sources: dict[str, str],
    retry_allowed: bool = False,
) -> list[Any]:
    show = None if show_ranks is None else set(show_ranks)
    pump = _OutputPump(workdir, world_size, show)
    start = time.monotonic()
    ranks = _Ranks(start_method, workdir, world_size)
    results: list[Any] = [None] * world_size
    failures: list[RankFailure] = []
    first_failure_at: float | None = None
    timed_out = False
    try:
        while ranks.running():
            ranks.poll(_POLL_S)
            pump.pump()
            for rank, code in ranks.exit_codes.items():
                if code != 0 and all(f.rank != rank for f in failures):
                    failures.append(_failure(workdir, rank, code, sources))
                    first_failure_at = first_failure_at or time.monotonic()
            now = time.monotonic()
            if first_failure_at is not None and now - first_failure_at > _FAILURE_GRACE_S:
                break
            if now - start > timeout:
                timed_out = True
                break
    except BaseException:  # Ctrl-C / kernel interrupt, or the fork server died: end every rank
        ranks.terminate(ranks.pids, pump.pump)
        ranks.close()
        pump.pump(final=True)
        pump.settle()
        raise
    stragglers = ranks.running()
    if stragglers:
        ranks.terminate(stragglers, pump.pump)
    ranks.close()
    pump.pump(final=True)
    for rank, code in sorted(ranks.exit_codes.items()):
        record = _read_result(workdir, rank)
        if code == 0 and record is not None and record[0] == "ok":
            results[rank] = record[1]
        elif all(f.rank != rank for f in failures) and rank not in stragglers:
            failures.append(_failure(workdir, rank, code, sources))
    _order_failures(failures, workdir)
    if timed_out:
        pump.settle()
        failures.extend(RankFailure(rank, "timed out") for rank in stragglers)
        raise LaunchError(
            f"launch timed out after {timeout:g} s: rank{'s' if len(stragglers) > 1 else ''} "
            f"{', '.join(map(str, stragglers))} never finished (a rank blocked in a collective waits for a "
            "peer that never joins it).",
            failures,
            results,
        )
    if failures:
        failed = [f for f in failures if f.kind != "timed out"]
        failures.extend(RankFailure(rank, "terminated") for rank in stragglers)
        error = LaunchError(
            f"launch failed: {len(failed)} of {world_size} rank{'s' if world_size > 1 else ''} failed"
            + _terminated_note(stragglers),
            failures,
            results,
        )
        pump.settle(drop=retry_allowed and group_never_formed(error))
        raise error
    pump.settle()
    return results


def _order_failures(failures: list[RankFailure], workdir: str) -> None:
    """First failure first; later ones are marked as consequences.

    A rank that raised failed when it wrote its error; a rank that died without one, when its exit was seen.
    """

    def when(f: RankFailure) -> float:
        try:
            return os.stat(_rank.result_path(workdir, f.rank)).st_mtime_ns / 1e9
        except FileNotFoundError:
            return f.seen_at

    failures.sort(key=when)
    if len(failures) > 1:
        first = failures[0].rank
        for f in failures[1:]:
            f.after = first


def _source_map(fn: Callable[..., Any]) -> dict[str, str]:
    """Function name -> source file, for fn and the notebook functions it calls (for remote tracebacks)."""
    mapping: dict[str, str] = {}
    seen: set[int] = set()

    def visit(obj: Any, depth: int) -> None:
        code = getattr(obj, "__code__", None)
        if code is None or id(obj) in seen or depth > 3:
            return
        seen.add(id(obj))
        stack = [code]
        while stack:
            c = stack.pop()
            mapping.setdefault(c.co_name, c.co_filename)
            stack.extend(k for k in c.co_consts if hasattr(k, "co_name"))
        for cell in getattr(obj, "__closure__", None) or ():
            try:
                visit(cell.cell_contents, depth + 1)
            except ValueError:
                pass
        namespace = getattr(obj, "__globals__", {})
        for name in code.co_names:
            value = namespace.get(name)
            if getattr(value, "__module__", None) == getattr(obj, "__module__", None):
                visit(value, depth + 1)

    visit(fn, 0)
    return mapping


def _with_sources(traceback_text: str, sources: dict[str, str]) -> str:
    """Put back the file and source line of by-value frames (cloudpickle names them <dynamic-code>)."""

    def replace(match: "re.Match[str]") -> str:
        line, name = int(match.group(1)), match.group(2)
        filename = sources.get(name)
        if filename is None:
            return match.group(0)
        source = linecache.getline(filename, line).strip()
        where = _display_name(filename)
        place = f"{where}, line {line}" if where != filename else f'File "{filename}", line {line}'
        return f"  {place}, in {name}\n" + (f"    {source}\n" if source else "")

    return re.sub(r'  File "<dynamic-code>", line (\d+), in (\S+)\n', replace, traceback_text)


def _terminated_note(ranks: list[int]) -> str:
    if not ranks:
        return ""
    if len(ranks) == 1:
        return f"; rank {ranks[0]} was terminated"
    return f"; ranks {', '.join(map(str, ranks))} were terminated"


def _display_name(filename: str) -> str:
    """A notebook cell's file as IPython names it ("Cell In[7]"); other files unchanged."""
    shell = sys.modules.get("IPython") and sys.modules["IPython"].get_ipython()
    number = getattr(getattr(shell, "compile", None), "_filename_map", {}).get(filename)
    return f"Cell In[{number}]" if number is not None else filename


def _failure(workdir: str, rank: int, code: int, sources: dict[str, str]) -> RankFailure:
    record = _read_result(workdir, rank)
    if record is not None and record[0] == "error":
        info = record[1]
        exception = None
        if info.get("exception") is not None:
            try:
                exception = cloudpickle.loads(info["exception"])
            except Exception:
                exception = None
        return RankFailure(
            rank,
            "raised",
            info["type"],
            info["message"],
            _with_sources(info["traceback"], sources),
            code,
            exception,
            phase=info.get("phase", ""),
        )
    return RankFailure(rank, "exited", exit_code=code)
