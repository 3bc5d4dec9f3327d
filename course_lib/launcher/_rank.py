"""What runs inside one launched rank: environment, process group, the learner's function, the result.

The parent (``course_lib.launcher.launch``) writes ``payload.pkl`` into a private work folder; each rank reads it,
runs, and writes ``result.<rank>.pkl`` there. The same code serves the three start methods: forked by the
preloading fork server (``course_lib.launcher._zygote``), forked from the kernel, or spawned as
``python -m course_lib.launcher._rank WORKDIR RANK``.
"""
from __future__ import annotations

import os
import sys
import traceback
from datetime import timedelta
from typing import Any

import cloudpickle

from course_lib.launcher import _pickling

PAYLOAD = "payload.pkl"
RENDEZVOUS = "rendezvous"


def result_path(workdir: str, rank: int) -> str:
    return os.path.join(workdir, f"result.{rank}.pkl")


def group_marker_path(workdir: str, rank: int) -> str:
    """A file a rank creates once its process group has formed (or at once, when it makes none): until then
    the launcher holds back the rank's stderr, which a failed rendezvous that is retried would fill with noise."""
    return os.path.join(workdir, f"group.{rank}.formed")


def output_path(workdir: str, rank: int, stream: str) -> str:
    return os.path.join(workdir, f"{stream}.{rank}.log")


def set_parent_death_signal(sig: int) -> None:
    """Ask Linux to send `sig` to this process when its parent dies (no-op elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except OSError:
        pass


def torchrun_env(rank: int, world_size: int, master_port: int) -> dict[str, str]:
    """The variables torchrun sets for a single-node job, so launched code reads them as it would there."""
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(world_size),
        "GROUP_RANK": "0",
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(world_size),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(master_port),
        # A single-node group talks over loopback only.
        "GLOO_SOCKET_IFNAME": "lo",
        "NCCL_SOCKET_IFNAME": "lo",
    }


def device_for(backend: str, local_rank: int) -> str:
    """The device a rank computes on: ``cuda:LOCAL_RANK`` under NCCL, ``cpu`` under gloo."""
    return f"cuda:{local_rank}" if backend == "nccl" else "cpu"


def rank_device() -> "torch.device":
    """This rank's device: ``cuda:LOCAL_RANK`` when the group runs NCCL, else the CPU."""
    import torch
    import torch.distributed as dist

    backend = dist.get_backend() if dist.is_available() and dist.is_initialized() else "gloo"
    return torch.device(device_for(backend, int(os.environ.get("LOCAL_RANK", "0"))))


def prepare_rank(backend: str, local_rank: int, local_world_size: int) -> None:
    """Per-rank process setup shared by launch() and torchrun: quiet warnings, threads, device."""
    from course_lib.launcher import quiet

    quiet.install()
    import torch

    if "OMP_NUM_THREADS" not in os.environ:
        # torchrun sets OMP_NUM_THREADS=1 for multi-process jobs; share the cores out instead.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, local_world_size)))
    if backend == "nccl":
        torch.cuda.set_device(local_rank)


def init_group(backend: str, init_method: str, rank: int, world_size: int, timeout_s: float) -> None:
    """Initialise the default process group (NCCL binds the rank to its GPU up front)."""
    import torch
    import torch.distributed as dist

    extra: dict[str, Any] = {}
    if backend == "nccl":
        extra["device_id"] = torch.device(device_for(backend, int(os.environ.get("LOCAL_RANK", rank))))
    dist.init_process_group(
        backend=backend,
        init_method=init_method,
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
        **extra,
    )


def destroy_group() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _write_result(workdir: str, rank: int, record: tuple[str, Any]) -> None:
    path = result_path(workdir, rank)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(_pickling.dumps(record))
    os.replace(tmp, path)


def _error_record(exc: BaseException, phase: str) -> dict[str, Any]:
    try:
        pickled = _pickling.dumps(exc)
    except Exception:
        pickled = None
    return {
        "type": type(exc).__name__,
        "message": str(exc),
        # Drop this module's own frame: the learner's code starts one frame down.
        "traceback": "".join(
            traceback.format_exception(type(exc), exc, exc.__traceback__ and exc.__traceback__.tb_next)
        ),
        "exception": pickled,
        # "setup" (payload, environment), "group" (creating the process group) or "function" (the learner's
        # code): the launcher starts a launch again when the first rank to fail failed in "group".
        "phase": phase,
    }


def _redirect_output(workdir: str, rank: int) -> None:
    """Send fd 1 and 2 to per-rank files that the parent tails live into the cell."""
    for fd, stream in ((1, "out"), (2, "err")):
        target = os.open(output_path(workdir, rank, stream), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(target, fd)
        os.close(target)
    sys.stdout = open(1, "w", encoding="utf-8", errors="replace", buffering=1, closefd=False)
    sys.stderr = open(2, "w", encoding="utf-8", errors="replace", buffering=1, closefd=False)


def main(workdir: str, rank: int) -> int:
    """Run one rank of a launch; returns the process exit code (0 when a result was written)."""
    _redirect_output(workdir, rank)
    code = 1
    phase = "setup"
    try:
        with open(os.path.join(workdir, PAYLOAD), "rb") as f:
            header = cloudpickle.load(f)  # plain data: config first, so sys.path is set before the function
            for entry in reversed(header["sys_path"]):
                if entry not in sys.path:
                    sys.path.insert(0, entry)
            os.chdir(header["cwd"])
            os.environ.update(torchrun_env(rank, header["world_size"], header["master_port"]))
            os.environ["COURSE_PROGRESS_FILE"] = os.path.join(workdir, "progress.jsonl")  # course_lib.launcher.progress
            prepare_rank(header["backend"], rank, header["world_size"])
            fn, args, kwargs = cloudpickle.load(f)
        if header["init_group"]:
            phase = "group"
            init_group(
                header["backend"],
                f"file://{os.path.join(workdir, RENDEZVOUS)}",
                rank,
                header["world_size"],
                header["timeout_s"],
            )
        open(group_marker_path(workdir, rank), "w").close()
        phase = "function"
        value = fn(*args, **kwargs)
        try:
            _write_result(workdir, rank, ("ok", value))
            code = 0
        except Exception as exc:  # the value cannot travel back
            raise TypeError(
                f"rank {rank} returned a {type(value).__name__} that cannot be pickled ({exc}); "
                "return plain data (tensors, numbers, lists, dicts)"
            ) from None
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the parent
        # Not printed here: the parent raises LaunchError with this traceback, once.
        try:
            _write_result(workdir, rank, ("error", _error_record(exc, phase)))
        except Exception:
            pass
        code = 1
    finally:
        try:
            destroy_group()
        except Exception:
            pass
        sys.stdout.flush()
        sys.stderr.flush()
    return code


SPAWN_CODE = "import sys; from course_lib.launcher import _rank; sys.exit(_rank.spawned_main(sys.argv[1], int(sys.argv[2])))"


def spawned_main(workdir: str, rank: int) -> int:
    """Entry point of the spawn start method: ``python -c SPAWN_CODE WORKDIR RANK``."""
    import signal

    set_parent_death_signal(signal.SIGKILL)
    return main(workdir, rank)
