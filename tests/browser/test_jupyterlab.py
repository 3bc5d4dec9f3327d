"""The labs in a real JupyterLab, driven by headless Chromium (run with `make test-browser`, or in `make test`)."""
from __future__ import annotations

import time

import psutil
import pytest

from labdriver import CHROMIUM, LabSession

playwright_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed in .venv")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="no Chromium on this machine (apt-get install chromium); .ci/run installs it"
)


@pytest.fixture
def lab():
    with playwright_api.sync_playwright() as p:
        session = LabSession(p)
        try:
            yield session
        finally:
            server_pid = session.server.pid
            session.close()
            assert not psutil.pid_exists(server_pid) or psutil.Process(server_pid).status() == "zombie"


def test_setup_lab_runs_in_jupyterlab_and_launch_streams_into_the_cell(lab):
    start = time.monotonic()
    lab.open("00_setup.ipynb")
    assert lab.dialogs() == [], f"a dialog greets the learner: {lab.dialogs()}"
    doctor = lab.run_until("course_lib.doctor()")
    assert "All good" in lab.output_text(doctor)
    index = lab.run_until("launch(hello, world_size=2)")
    out = lab.output_text(index)
    assert "[rank 0] 2 ranks, backend 'gloo'" in out and "[1.0, 1.0]" in out, out
    lab.screenshot("00_setup-first-launch")
    assert time.monotonic() - start < 240
