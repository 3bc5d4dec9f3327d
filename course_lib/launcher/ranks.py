"""Persistent ranks: run notebook cells on a live process group, with state kept between cells.

    ranks = Ranks(world_size=2)            # starts 2 ranks once, process group initialised
    %%distributed                          # this cell runs on every rank; its names persist per rank
    model = build_sharded_model()
    ranks.pull("model.plan")               # an expression's value from every rank, by rank
    ranks.run(fn, *args)                   # fn runs on every rank with that rank's names as globals
    ranks.close()                          # or %dist_reset to start over

A one-shot ``launch()`` starts every rank afresh; here the ranks stay up, so a model built in one cell
can be inspected in the next and trained in a third (as ipyparallel's engines allow), with the torch
process group already initialised. The kernel talks to the ranks over a Unix socket in a private folder
(never a TCP port); the group meets on loopback as in ``launch()``.

Failures: an exception on any rank raises :class:`course_lib.LaunchError` in the kernel with each failing
rank's traceback. If every rank still answers, their state survives. If some rank does not answer within
a grace period (it is stuck in a collective its failed peer never joined), or a cell outruns its timeout,
or a rank dies, the ranks are restarted and you are told that their state was lost. Ctrl-C interrupts the
ranks; ranks that do not return within a grace period are restarted.
"""
from __future__ import annotations

import ast
import builtins
import linecache
import os
import select
import shutil
import signal
import socket
import struct
import sys
import tempfile
import time
import types
from typing import Any, Callable, Iterable

import cloudpickle

from course_lib.launcher import _pickling, _rank
from course_lib.launcher.launch import (
    GROUP_ATTEMPTS,
    LaunchError,
    RankFailure,
    _OutputPump,
    _Ranks,
    _source_map,
    _free_port,
    _read_result,
    _validate,
    _with_sources,
    _log_backend,
    default_backend,
    notice,
    resolve_backend,
)

__all__ = ["Ranks", "current"]

_FAILURE_GRACE_S = 2.0  # after one rank fails, how long the others get to answer before the group is deemed stuck
_INTERRUPT_GRACE_S = 3.0
_START_TIMEOUT_S = 120.0
_HEADER = struct.Struct("!Q")


class _GroupNeverFormed(RuntimeError):
    """The ranks failed while creating their process group, before any request ran."""


# ------------------------------------------------------------------------------------------- the wire


def _send(sock: socket.socket, message: Any) -> None:
    data = _pickling.dumps(message)
    sock.sendall(_HEADER.pack(len(data)) + data)


def _recv_exactly(sock: socket.socket, n: int) -> bytes | None:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _recv(sock: socket.socket) -> Any:
    header = _recv_exactly(sock, _HEADER.size)
    if header is None:
        return None
    body = _recv_exactly(sock, _HEADER.unpack(header)[0])
    return None if body is None else cloudpickle.loads(body)


# -------------------------------------------------------------------------------------- rank side


def _run_cell(source: str, namespace: dict[str, Any], filename: str) -> str | None:
    """Execute a cell's source in `namespace`; return the repr of a final expression, if any."""
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    tree = ast.parse(source, filename, "exec")
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    exec(compile(tree, filename, "exec"), namespace)
    if last is None:
        return None
    value = eval(compile(ast.Expression(last.value), filename, "eval"), namespace)
    return None if value is None else repr(value)


def _call(fn: Callable[..., Any], args: tuple, kwargs: dict, namespace: dict[str, Any]) -> Any:
    """Call a shipped function with the rank's names as its globals (the rank's own names win).

    The notebook names it refers to arrived with it (cloudpickle) and fill in what the rank lacks;
    a name it sets with ``global`` is kept in the rank's namespace afterwards.
    """
    shipped = getattr(fn, "__globals__", None)
    if not isinstance(fn, types.FunctionType) or shipped is None:
        return fn(*args, **kwargs)
    scope = {**shipped, **namespace}
    bound = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__, fn.__closure__)
    bound.__kwdefaults__ = fn.__kwdefaults__
    try:
        return bound(*args, **kwargs)
    finally:
        for name in fn.__code__.co_names:
            if name in scope and (name not in shipped or scope[name] is not shipped[name]):
                if namespace.get(name, _MISSING) is not scope[name]:
                    namespace[name] = scope[name]


_MISSING = object()


def _serve(socket_path: str) -> None:
    """The loop a persistent rank runs: take a request, run it, answer, until told to close."""
    import torch.distributed as dist

    rank = dist.get_rank()
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(socket_path)
    _send(conn, ("hello", rank))
    namespace: dict[str, Any] = {"__name__": "__distributed__", "__builtins__": builtins}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    while True:
        try:
            request = _recv(conn)
        except KeyboardInterrupt:  # an interrupt that arrived between requests
            continue
        if request is None or request[0] == "close":
            return
        kind = request[0]
        try:
            if kind == "exec":
                value: Any = _run_cell(request[1], namespace, request[2])
            elif kind == "eval":
                value = eval(request[1], namespace)
            else:  # "call"
                value = _call(request[1], request[2], request[3], namespace)
            sys.stdout.flush()
            sys.stderr.flush()
            try:
                _send(conn, ("ok", value))
            except Exception as exc:  # noqa: BLE001
                raise TypeError(
                    f"rank {rank} produced a {type(value).__name__} that cannot be pickled ({exc})"
                ) from None
        except KeyboardInterrupt as exc:
            _send(conn, ("interrupted", _rank._error_record(exc, "function")))
        except BaseException as exc:  # noqa: BLE001
            sys.stdout.flush()
            sys.stderr.flush()
            _send(conn, ("error", _rank._error_record(exc, "function")))


# ------------------------------------------------------------------------------------- kernel side


_current: "Ranks | None" = None


def current() -> "Ranks":
    """The most recently started :class:`Ranks` (the one ``%%distributed`` runs on)."""
    if _current is None or _current.closed:
        raise RuntimeError("no live ranks: start them with `ranks = course_lib.Ranks(world_size=2)`")
    return _current


class Ranks:
    """A live process group of `world_size` ranks that runs cells and functions on request.

    Args:
        world_size: number of ranks.
        backend: ``"gloo"``, ``"nccl"`` (one GPU per rank) or ``"auto"``; None: ``$COURSE_BACKEND``, else gloo.
        timeout: default seconds a cell or call may take before the ranks are restarted.
        start_method: as for :func:`course_lib.launcher.launch`.
        show_ranks: the ranks whose output reaches the cell (default: all).
    """

    def __init__(
        self,
        world_size: int = 2,
        backend: str | None = None,
        timeout: float = 300,
        start_method: str = "forkserver",
        show_ranks: Iterable[int] | None = None,
    ) -> None:
        if backend is None:
            backend = default_backend(world_size)
        _validate(lambda: None, world_size, backend, timeout, start_method)
        self.world_size = world_size
        self.backend = resolve_backend(backend, world_size)
        _log_backend(self.backend, world_size)
        if backend == "auto":
            print(f"Ranks: backend='auto' chose {self.backend!r}")
        self.timeout = float(timeout)
        self.start_method = start_method
        self.show = None if show_ranks is None else set(show_ranks)
        self.closed = True
        self._cells = 0
        self._start()
        global _current
        _current = self
        _register_magics()

    # ------------------------------------------------------------------------------ lifecycle

    def _start(self) -> None:
        """Start the ranks; start them again (fresh rendezvous) when their process group failed to form."""
        for attempt in range(1, GROUP_ATTEMPTS + 1):
            self._retry_allowed = attempt < GROUP_ATTEMPTS
            try:
                self._start_once()
                return
            except _GroupNeverFormed as error:
                if attempt == GROUP_ATTEMPTS:
                    raise RuntimeError(f"the ranks' process group did not form in {attempt} attempts: {error}") from None
                notice(
                    f"Ranks: the process group did not form ({error}); starting the ranks again with a fresh "
                    f"rendezvous (attempt {attempt + 1} of {GROUP_ATTEMPTS})."
                )

    def _group_failure(self, dead: list[int]) -> str | None:
        """One line on why the group did not form, when a rank that died while starting failed creating it
        (its peers then fail or wait because of it); else None."""
        for rank in dead:
            record = _read_result(self.workdir, rank)
            if record is not None and record[0] == "error" and record[1].get("phase") == "group":
                message = record[1]["message"].strip().splitlines()
                return f"rank {rank} raised {record[1]['type']}: {message[0][:160] if message else ''}"
        return None

    def _start_once(self) -> None:
        self.workdir = tempfile.mkdtemp(prefix="course-ranks-")
        socket_path = os.path.join(self.workdir, "control.sock")
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(socket_path)
        self._listener.listen(self.world_size)
        header = {
            "world_size": self.world_size,
            "backend": self.backend,
            "timeout_s": self.timeout,
            "init_group": True,
            "sys_path": [p for p in sys.path if p],
            "cwd": os.getcwd(),
            "master_port": _free_port(),
        }
        with open(os.path.join(self.workdir, _rank.PAYLOAD), "wb") as f:
            f.write(_pickling.dumps(header))
            f.write(_pickling.dumps((_serve, (socket_path,), {})))
        self._pump = _OutputPump(self.workdir, self.world_size, self.show)
        self._procs = _Ranks(self.start_method, self.workdir, self.world_size)
        self._conns: dict[int, socket.socket] = {}
        deadline = time.monotonic() + _START_TIMEOUT_S
        self._listener.settimeout(0.05)
        try:
            while len(self._conns) < self.world_size:
                try:
                    conn, _ = self._listener.accept()
                except socket.timeout:
                    self._procs.poll(0)
                    self._pump.pump()
                    dead = [r for r, c in self._procs.exit_codes.items()]
                    never_formed = self._group_failure(dead) if dead else None
                    if never_formed:
                        raise _GroupNeverFormed(never_formed)
                    if dead or time.monotonic() > deadline:
                        raise RuntimeError(
                            f"the ranks did not start (exited: {dead or 'none'}; "
                            f"{_START_TIMEOUT_S:g} s limit); see their output above"
                        )
                    continue
                conn.settimeout(None)
                hello = _recv(conn)
                self._conns[int(hello[1])] = conn
        except BaseException as error:
            # gloo's log of a failed connect, held back by the pump, is noise when the ranks start again
            self._drop_held = isinstance(error, _GroupNeverFormed) and getattr(self, "_retry_allowed", False)
            self._stop()
            raise
        self.closed = False

    def _stop(self) -> None:
        for conn in getattr(self, "_conns", {}).values():
            try:
                _send(conn, ("close",))
            except OSError:
                pass
        procs = getattr(self, "_procs", None)
        if procs is not None:
            deadline = time.monotonic() + 1.0
            while procs.running() and time.monotonic() < deadline:
                procs.poll(0.01)
            if procs.running():
                procs.terminate(procs.pids, self._pump.pump)
            procs.close()  # and whatever the ranks started
            self._pump.pump(final=True)
            self._pump.settle(drop=getattr(self, "_drop_held", False))
            self._drop_held = False
        for conn in getattr(self, "_conns", {}).values():
            conn.close()
        self._conns = {}
        if getattr(self, "_listener", None) is not None:
            self._listener.close()
        shutil.rmtree(self.workdir, ignore_errors=True)
        self.closed = True

    def close(self) -> None:
        """Stop the ranks and remove their files (their state is gone)."""
        if not self.closed:
            self._stop()

    def restart(self) -> None:
        """Stop the ranks and start fresh ones (a new process group, empty namespaces)."""
        self.close()
        self._start()

    def __enter__(self) -> "Ranks":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"live, pids {sorted(self._procs.pids.values())}"
        return f"Ranks(world_size={self.world_size}, backend={self.backend!r}, {state})"

    # ------------------------------------------------------------------------------ requests

    def run(self, fn: Callable[..., Any], *args: Any, timeout: float | None = None, **kwargs: Any) -> list[Any]:
        """Call ``fn(*args, **kwargs)`` on every rank, with that rank's names as globals; results by rank."""
        if not callable(fn):
            raise TypeError(f"run() needs a function; got {type(fn).__name__}")
        return self._request(("call", fn, args, kwargs), timeout, _source_map(fn))

    def pull(self, expression: str, timeout: float | None = None) -> list[Any]:
        """The value of `expression` evaluated in every rank's namespace, by rank."""
        return self._request(("eval", expression), timeout, {})

    def execute(self, source: str, timeout: float | None = None) -> list[str | None]:
        """Run a cell's source on every rank; returns each rank's repr of a final expression (or None)."""
        self._cells += 1
        filename = f"<distributed cell {self._cells}>"
        return self._request(("exec", source, filename), timeout, {})

    def _request(self, message: tuple, timeout: float | None, sources: dict[str, str]) -> list[Any]:
        if self.closed:
            raise RuntimeError("these ranks are closed: start new ones with Ranks(...) or %dist_reset")
        limit = self.timeout if timeout is None else float(timeout)
        try:
            for conn in self._conns.values():
                _send(conn, message)
        except Exception as exc:
            if isinstance(exc, OSError):
                self._lost(f"a rank is gone ({exc})")
            raise TypeError(f"cannot ship this request to the ranks: {exc}") from None
        replies: dict[int, tuple] = {}
        start = time.monotonic()
        first_failure: float | None = None
        by_fd = {conn.fileno(): rank for rank, conn in self._conns.items()}
        try:
            while len(replies) < self.world_size:
                waiting = [self._conns[r] for r in self._conns if r not in replies]
                watch: list[Any] = list(waiting)
                if self._procs.server is not None:
                    watch.append(self._procs.server.rfd)
                readable, _, _ = select.select(watch, [], [], 0.05)
                for item in readable:
                    if isinstance(item, socket.socket):
                        rank = by_fd[item.fileno()]
                        reply = _recv(item)
                        if reply is None:
                            continue  # closed: the exit shows up below
                        replies[rank] = reply
                        if reply[0] != "ok" and first_failure is None:
                            first_failure = time.monotonic()
                self._procs.poll(0)
                self._pump.pump()
                if self._procs.exit_codes:
                    self._pump.pump(final=True)
                    dead = sorted(self._procs.exit_codes)
                    self._restart_after_failure(
                        f"rank{'s' if len(dead) > 1 else ''} {', '.join(map(str, dead))} died", replies, sources
                    )
                now = time.monotonic()
                if first_failure is not None and now - first_failure > _FAILURE_GRACE_S:
                    self._restart_after_failure(
                        "a rank failed while its peers were still busy (most likely waiting in a collective "
                        "it never joined)",
                        replies,
                        sources,
                    )
                if now - start > limit:
                    stuck = [r for r in range(self.world_size) if r not in replies]
                    self._restart_after_failure(
                        f"timed out after {limit:g} s: rank{'s' if len(stuck) > 1 else ''} "
                        f"{', '.join(map(str, stuck))} never finished",
                        replies,
                        sources,
                    )
        except KeyboardInterrupt:
            self._interrupt(replies)
            raise
        self._pump.pump()
        self._pump.progress.close()  # one bar per request
        failures = [self._failure(r, replies[r], sources) for r in sorted(replies) if replies[r][0] != "ok"]
        if failures:
            raise LaunchError(
                f"{len(failures)} of {self.world_size} ranks raised; every rank answered, so their state is kept",
                failures,
                [replies[r][1] if replies[r][0] == "ok" else None for r in range(self.world_size)],
            )
        return [replies[r][1] for r in range(self.world_size)]

    def _failure(self, rank: int, reply: tuple, sources: dict[str, str]) -> RankFailure:
        info = reply[1]
        return RankFailure(rank, "raised", info["type"], info["message"], _with_sources(info["traceback"], sources))

    def _restart_after_failure(self, why: str, replies: dict[int, tuple], sources: dict[str, str]) -> None:
        failures = [self._failure(r, replies[r], sources) for r in sorted(replies) if replies[r][0] != "ok"]
        failures += [RankFailure(r, "timed out") for r in range(self.world_size) if r not in replies]
        results = [replies[r][1] if r in replies and replies[r][0] == "ok" else None for r in range(self.world_size)]
        self._lost(why)
        raise LaunchError(f"{why}; the ranks were restarted and their state was lost", failures, results)

    def _lost(self, why: str) -> None:
        self._stop()
        print(f"Ranks: {why}. Restarting {self.world_size} ranks: names set on them before are gone.", file=sys.stderr)
        self._start()

    def _interrupt(self, replies: dict[int, tuple]) -> None:
        """Ctrl-C: interrupt the ranks; restart the ones that do not come back within a grace period."""
        pending = [r for r in range(self.world_size) if r not in replies]
        self._procs.signal([r for r in pending], signal.SIGINT)
        deadline = time.monotonic() + _INTERRUPT_GRACE_S
        while pending and time.monotonic() < deadline:
            readable, _, _ = select.select([self._conns[r] for r in pending], [], [], 0.05)
            for conn in readable:
                rank = next(r for r, c in self._conns.items() if c is conn)
                reply = _recv(conn)
                if reply is not None:
                    replies[rank] = reply
            pending = [r for r in range(self.world_size) if r not in replies]
            self._pump.pump()
        self._pump.pump(final=True)
        if pending:
            self._lost(f"rank{'s' if len(pending) > 1 else ''} {', '.join(map(str, pending))} did not stop on interrupt")
        else:
            print("Ranks: interrupted; every rank stopped and kept its state.", file=sys.stderr)


# ----------------------------------------------------------------------------------------- magics


def _distributed_magic(line: str, cell: str) -> None:
    """%%distributed [timeout=SECONDS]: run this cell on every live rank."""
    timeout = None
    for word in line.split():
        if word.startswith("timeout="):
            timeout = float(word.split("=", 1)[1])
    ranks = current()
    values = ranks.execute(cell, timeout=timeout)
    for rank, value in enumerate(values):
        if value is not None and (ranks.show is None or rank in ranks.show):
            print(f"[rank {rank}] Out: {value}")


def _dist_reset_magic(line: str) -> None:
    """%dist_reset: restart the live ranks (new process group, empty namespaces)."""
    ranks = current()
    ranks.restart()
    print(f"Ranks: restarted {ranks.world_size} ranks.")


def _register_magics() -> None:
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is None:
        return
    shell.register_magic_function(_distributed_magic, "cell", "distributed")
    shell.register_magic_function(_dist_reset_magic, "line", "dist_reset")
