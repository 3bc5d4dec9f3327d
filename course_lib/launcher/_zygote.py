"""The preloading fork server behind ``launch(start_method="forkserver")``.

It imports the modules named on its command line once (torch; torchrec for the full server), says
"ready", then forks ranks on request: the ranks start with those imports paid for. It does not start CUDA
(the launcher sets PYTORCH_NVML_BASED_CUDA_CHECK=1, so torchrec's torch.cuda.is_available() asks NVML), so the
ranks it forks may still use it. The launcher keeps one per kernel (see course_lib.launcher.launch).

Protocol, one JSON object per line. Parent -> server on stdin:
    {"cmd": "spawn", "workdir": DIR, "ranks": [0, 1]}
Server -> parent on the original stdout:
    {"event": "ready"}    {"event": "started", "workdir": DIR, "rank": R, "pid": P}    {"event": "exit", "pid": P, "code": C}
The code is the exit status, or minus the signal number that ended the rank.
Each rank runs in a session of its own. On EOF (the kernel went away) or SIGTERM the server kills its
ranks' sessions (the ranks and whatever they started), removes their work folders and exits.
"""
from __future__ import annotations

import importlib
import json
import os
import select
import shutil
import signal
import sys
from typing import Any


def _exit_code(status: int) -> int:
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


class _Server:
    def __init__(self) -> None:
        # Keep the protocol off fds 0/1: a forked rank must never write into it.
        self.rfd = os.dup(0)
        self.wfd = os.dup(1)
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(2, 1)
        os.close(devnull)
        self.children: dict[int, str] = {}  # pid -> workdir
        self.workdirs: set[str] = set()
        self.buffer = b""

    def send(self, message: dict[str, Any]) -> None:
        os.write(self.wfd, (json.dumps(message) + "\n").encode())

    def spawn(self, workdir: str, ranks: list[int]) -> None:
        self.workdirs.add(workdir)
        for rank in ranks:
            pid = os.fork()
            if pid == 0:  # the rank
                code = 1
                try:
                    os.setsid()  # a session of its own: whatever the rank starts, the launcher can end with it
                    os.close(self.rfd)
                    os.close(self.wfd)
                    signal.signal(signal.SIGTERM, signal.SIG_DFL)
                    signal.signal(signal.SIGINT, signal.default_int_handler)
                    from course_lib.launcher import _rank

                    _rank.set_parent_death_signal(signal.SIGKILL)
                    code = _rank.main(workdir, rank)
                finally:
                    os._exit(code)
            self.children[pid] = workdir
            self.send({"event": "started", "workdir": workdir, "rank": rank, "pid": pid})

    def reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            workdir = self.children.pop(pid, None)
            self.send({"event": "exit", "pid": pid, "code": _exit_code(status)})
            if workdir is not None and workdir not in self.children.values():
                self.workdirs.discard(workdir)

    def shutdown(self, *_: Any) -> None:
        for pid in list(self.children):
            for kill in (os.killpg, os.kill):  # the rank's session (what it started), then the rank itself
                try:
                    kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        for pid in list(self.children):
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        for workdir in self.workdirs:
            shutil.rmtree(workdir, ignore_errors=True)
        os._exit(0)

    def handle(self, line: bytes) -> None:
        request = json.loads(line)
        if request.get("cmd") == "spawn":
            self.spawn(request["workdir"], [int(r) for r in request["ranks"]])

    def serve(self) -> None:
        parent = os.getppid()
        while True:
            timeout = 0.005 if self.children else 1.0
            readable, _, _ = select.select([self.rfd], [], [], timeout)
            if readable:
                chunk = os.read(self.rfd, 65536)
                if not chunk:
                    self.shutdown()
                self.buffer += chunk
                while b"\n" in self.buffer:
                    line, self.buffer = self.buffer.split(b"\n", 1)
                    if line.strip():
                        self.handle(line)
            self.reap()
            if os.getppid() != parent:  # the kernel died and we were re-parented
                self.shutdown()


def main() -> None:
    from course_lib.launcher import _rank

    _rank.set_parent_death_signal(signal.SIGTERM)
    server = _Server()
    signal.signal(signal.SIGTERM, server.shutdown)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for module in sys.argv[1:]:
        try:
            importlib.import_module(module)
        except Exception:  # a module that fails to import fails in the rank, with its own error
            pass
    server.send({"event": "ready"})
    server.serve()


if __name__ == "__main__":
    main()
