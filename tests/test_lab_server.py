"""`make lab` serves JupyterLab on labs/, on loopback, as a learner gets it."""
from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import time
import urllib.request

from conftest import REPO


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_make_lab_serves_the_labs_on_loopback():
    port, token = _free_port(), secrets.token_hex(16)
    proc = subprocess.Popen(
        ["make", "-s", "lab", f"LAB_PORT={port}", f"LAB_ARGS=--no-browser --IdentityProvider.token={token}"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    try:
        url = f"http://127.0.0.1:{port}/api/contents?token={token}"
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    listing = json.load(response)
                break
            except OSError:
                assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
                assert time.monotonic() < deadline, "JupyterLab did not answer within 90 s"
                time.sleep(0.5)
        names = {item["name"] for item in listing["content"]}
        expected = {p.name for p in (REPO / "labs").glob("*.ipynb")}
        assert expected <= names, f"labs/ not served: {names}"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/kernelspecs?token={token}", timeout=5) as r:
            assert "python3" in json.load(r)["kernelspecs"]
        listening = {
            c.laddr.ip
            for p in [proc] for c in __import__("psutil").Process(p.pid).children(recursive=True)[0].net_connections("inet")
            if c.status == "LISTEN"
        }
        assert listening <= {"127.0.0.1", "::1"}, listening
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen) -> None:
    """End make and the JupyterLab it started (its own process group)."""
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def test_learners_get_widgets_and_not_the_grading_panels():
    out = subprocess.run(
        [str(REPO / ".venv/bin/jupyter"), "labextension", "list"], capture_output=True, text=True, cwd=REPO
    )
    text = out.stdout + out.stderr
    widgets = next(line for line in text.splitlines() if "jupyterlab-manager" in line)
    assert "enabled" in widgets and "disabled" not in widgets
    nbgrader = next((line for line in text.splitlines() if "@jupyter/nbgrader v" in line), "")
    assert nbgrader == "" or "disabled" in nbgrader, nbgrader
