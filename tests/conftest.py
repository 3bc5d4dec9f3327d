"""Shared fixtures: a real Jupyter kernel driven as a notebook front-end would drive it."""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# tests/cluster installs Slurm and starts daemons as root: it runs only when named (`make test-cluster`,
# `pytest tests/cluster`), never in `make test` or `pytest tests`.
collect_ignore = ["cluster"]


def rejects(check, *args, match: str) -> str:
    """Assert that an exercise check fails on ``args`` with a message containing ``match``; return the message."""
    from course_lib.checks import CheckFailed

    with pytest.raises(CheckFailed) as failure:
        check(*args)
    assert match in str(failure.value), str(failure.value)
    return str(failure.value)


@dataclass
class CellRun:
    """What one executed cell produced, as the notebook would show it."""

    stdout: str = ""
    stderr: str = ""
    error: dict | None = None
    result: str = ""
    displays: list = field(default_factory=list)  # display_data / update_display_data mime bundles
    seconds: float = 0.0
    events: list = field(default_factory=list)  # (time, stream, text) in arrival order

    @property
    def ename(self) -> str | None:
        return None if self.error is None else self.error["ename"]

    @property
    def evalue(self) -> str:
        return "" if self.error is None else self.error["evalue"]


class Kernel:
    """A live ipykernel with the course's environment; `run(code)` executes a cell."""

    def __init__(self) -> None:
        from jupyter_client.manager import KernelManager

        import tempfile

        # A private TMPDIR: tests can then count the launcher's temporary folders without seeing others'.
        self.tmpdir = tempfile.mkdtemp(prefix="test-kernel-")
        self.km = KernelManager(kernel_name="python3")
        self.km.start_kernel(cwd=str(REPO), env={**os.environ, "PYTHONUNBUFFERED": "1", "TMPDIR": self.tmpdir})
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)

    @property
    def pid(self) -> int:
        return self.km.provisioner.process.pid  # type: ignore[union-attr]

    def run(self, code: str, timeout: float = 120, interrupt_when: str | None = None) -> CellRun:
        """Execute `code` as a cell; with `interrupt_when`, interrupt the kernel once that text is printed."""
        out = CellRun()
        start = time.monotonic()

        def hook(msg: dict) -> None:
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                setattr(out, content["name"], getattr(out, content["name"]) + content["text"])
                out.events.append((time.monotonic() - start, content["name"], content["text"]))
            elif kind == "error":
                out.error = content
            elif kind in ("display_data", "update_display_data"):
                out.displays.append(content["data"])
            elif kind == "execute_result":
                out.result = content["data"].get("text/plain", "")

        msg_id = self.kc.execute(code)
        interrupted = False
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"cell did not finish within {timeout} s:\n{code}")
            try:
                msg = self.kc.get_iopub_msg(timeout=min(remaining, 1.0))
            except Exception:
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
            hook(msg)
            if interrupt_when and not interrupted and interrupt_when in out.stdout:
                self.km.interrupt_kernel()
                interrupted = True
        out.seconds = time.monotonic() - start
        return out

    def close(self) -> None:
        import shutil

        try:
            self.kc.stop_channels()
        finally:
            if self.km.has_kernel:
                self.km.shutdown_kernel(now=True)
            shutil.rmtree(self.tmpdir, ignore_errors=True)


@pytest.fixture
def kernel():
    k = Kernel()
    try:
        yield k
    finally:
        k.close()


@pytest.fixture(scope="module")
def shared_kernel():
    """One kernel for a module's cheap checks (its fork server stays warm between tests)."""
    k = Kernel()
    k.run("import course_lib\nfrom course_lib import launch, LaunchError")
    try:
        yield k
    finally:
        k.close()
