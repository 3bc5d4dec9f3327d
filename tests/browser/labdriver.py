"""Drive the course in a real JupyterLab with headless Chromium, as a learner meets it.

`LabSession` starts JupyterLab from the course's .venv on 127.0.0.1 (random port and token) over a copy of
labs/, and Playwright drives Debian's Chromium (no browser download). Screenshots go to
tests/browser/artifacts/ (git-ignored).
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LabSession:
    """A JupyterLab server over a temporary copy of labs/, and a Chromium page on it."""

    def __init__(self, playwright: Any) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="course-browser-"))
        shutil.copytree(REPO / "labs", self.root / "labs")
        self.port, self.token = _free_port(), secrets.token_hex(16)
        jupyter = Path(sys.executable).parent / "jupyter"
        root_flag = ["--allow-root"] if os.geteuid() == 0 else []
        # Private user settings: render every cell (no windowing) so the driver can find cells by text.
        settings = self.root / "settings" / "@jupyterlab" / "notebook-extension"
        settings.mkdir(parents=True)
        (settings / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
        self.server = subprocess.Popen(
            [str(jupyter), "lab", "--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={self.port}",
             f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={self.root / 'labs'}", *root_flag],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            env={
                **os.environ,
                "COURSE_PROGRESS": "",  # a real front-end: widgets, not text lines
                "JUPYTERLAB_SETTINGS_DIR": str(self.root / "settings"),
                "JUPYTER_RUNTIME_DIR": str(self.root / "runtime"),
                "JUPYTERLAB_WORKSPACES_DIR": str(self.root / "workspaces"),  # no tabs restored from other runs
            },
        )
        self._wait_for_server()
        self.browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        self.page = self.browser.new_page(viewport={"width": 1400, "height": 1000})

    def _wait_for_server(self) -> None:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url('api/status')}", timeout=5) as r:
                    json.load(r)
                return
            except OSError:
                if self.server.poll() is not None:
                    raise RuntimeError("JupyterLab exited at start")
                time.sleep(0.5)
        raise RuntimeError("JupyterLab did not answer within 90 s")

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path}?token={self.token}"

    # ------------------------------------------------------------------------------- notebook actions

    def use_solved(self, notebook: str) -> None:
        """Replace the lab copy of `notebook` by its solution with outputs cleared: a learner who has done the exercises."""
        nb = json.loads((REPO / "solutions" / notebook).read_text())
        for cell in nb["cells"]:
            if cell["cell_type"] == "code":
                cell["outputs"], cell["execution_count"] = [], None
        (self.root / "labs" / notebook).write_text(json.dumps(nb))

    def open(self, notebook: str) -> None:
        cells = len(json.loads((self.root / "labs" / notebook).read_text())["cells"])
        self.page.goto(self.url(f"lab/tree/{notebook}"))
        self.page.wait_for_function(
            f"() => document.querySelectorAll('.jp-Notebook .jp-Cell').length >= {cells}", timeout=60_000
        )
        self.page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=60_000)
        self.next_cell = 0

    def cells(self) -> Any:
        return self.page.locator(".jp-Notebook .jp-Cell")

    def run_cells(self, count: int, timeout_s: float = 120, wait_last: bool = True) -> None:
        """Run the next `count` cells one by one (Shift+Enter), going on past cells that raise."""
        self.cells().nth(self.next_cell).locator(".jp-InputPrompt").click()
        self.page.keyboard.press("Escape")  # command mode
        for i in range(count):
            self.page.keyboard.press("Shift+Enter")
            if wait_last or i < count - 1:
                self.wait_idle(timeout_s)
        self.next_cell += count

    def running(self) -> bool:
        return self.page.evaluate(
            "() => Array.from(document.querySelectorAll('.jp-InputPrompt')).some(p => p.innerText.includes('*'))"
        )

    def run_until(self, text: str, timeout_s: float = 120, wait_last: bool = True) -> int:
        """Run cells until one whose source contains `text` has run; return its index."""
        sources = self.page.evaluate(
            "() => Array.from(document.querySelectorAll('.jp-Notebook .jp-Cell')).map(c =>"
            " c.classList.contains('jp-CodeCell') ? c.querySelector('.jp-InputArea-editor').innerText : '')"
        )
        index = next(i for i, s in enumerate(sources) if text in s and i >= self.next_cell)
        self.run_cells(index + 1 - self.next_cell, timeout_s, wait_last)
        return index

    def wait_idle(self, timeout_s: float = 120) -> None:
        self.page.wait_for_timeout(150)
        self.page.wait_for_function(
            "() => !Array.from(document.querySelectorAll('.jp-InputPrompt')).some(p => p.innerText.includes('*'))",
            timeout=timeout_s * 1000,
        )

    def output_text(self, index: int) -> str:
        return self.cells().nth(index).locator(".jp-OutputArea").inner_text()

    def dialogs(self) -> list[str]:
        return self.page.locator(".jp-Dialog").all_inner_texts()

    def screenshot(self, name: str) -> Path:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=False)
        return path

    def close(self) -> None:
        try:
            self.browser.close()
        finally:
            try:
                os.killpg(self.server.pid, signal.SIGTERM)
                self.server.wait(timeout=15)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.server.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            shutil.rmtree(self.root, ignore_errors=True)
