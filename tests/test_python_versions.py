"""The course installs on CPython 3.11 (any patch release), 3.12 and 3.13: setup chooses one, and every pin has a wheel for each.

The pins are checked with pip's own resolver in dry-run mode (``tools/wheels.py``): no download, no install.
Where the package index cannot be reached, those tests skip and say so.
"""
from __future__ import annotations

import contextlib
import functools
import http.server
import importlib.util
import io
import os
import re
import socket
import subprocess
import sys
import threading
import time
import types
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SETUP = REPO / "tools" / "setup_venv.sh"


def load_wheels():
    spec = importlib.util.spec_from_file_location("course_wheels", REPO / "tools" / "wheels.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


# ------------------------------------------------------------------ which interpreter setup takes
def fake_python(folder: Path, name: str, version: str, supported: bool) -> None:
    """An executable that answers setup's version probe as a Python `version` would (and --version)."""
    path = folder / name
    path.write_text(f"#!/bin/sh\necho {version}\nexit {0 if supported else 1}\n")
    path.chmod(0o755)


def choose(folder: Path, python: str | None = None) -> subprocess.CompletedProcess:
    os.symlink("/usr/bin/dirname", folder / "dirname")  # all setup needs before it chooses, and no real python
    env = {"PATH": str(folder), "SETUP_CHOOSE_ONLY": "1", "HOME": str(folder)}
    if python:
        env["PYTHON"] = python
    return subprocess.run(["/bin/bash", str(SETUP)], env=env, capture_output=True, text=True, timeout=60)


def test_setup_takes_the_newest_supported_python(tmp_path):
    fake_python(tmp_path, "python3.11", "3.11.9", True)
    fake_python(tmp_path, "python3.12", "3.12.3", True)
    fake_python(tmp_path, "python3.13", "3.13.1", True)
    done = choose(tmp_path)
    assert done.returncode == 0 and "would use python3.13 (Python 3.13.1)" in done.stdout, done.stderr


def test_setup_passes_over_an_unsupported_python(tmp_path):
    fake_python(tmp_path, "python3.11", "3.11.9", True)
    fake_python(tmp_path, "python3.12", "3.10.12", False)  # a python3.12 name on an older interpreter
    done = choose(tmp_path)
    assert done.returncode == 0 and "would use python3.11" in done.stdout, done.stderr


def setup_probe_accepts(version: tuple[int, int, int]) -> bool:
    """Runs setup's own version probe (the `python -c` in supported()) as an interpreter of `version` would."""
    code = re.search(r"\"\$1\" -c '(.*?)' 2>/dev/null", SETUP.read_text(), re.S).group(1)
    fake_sys = types.SimpleNamespace(version_info=version, exit=lambda status: (_ for _ in ()).throw(SystemExit(status)))
    with contextlib.redirect_stdout(io.StringIO()), pytest.raises(SystemExit) as done:
        exec(re.sub(r"^import sys;\s*", "", code), {"sys": fake_sys})
    return done.value.code == 0


@pytest.mark.parametrize("version", [(3, 11, 0), (3, 11, 2), (3, 11, 14), (3, 12, 0), (3, 13, 1)])
def test_setup_accepts_every_supported_python(version):
    """3.11.2 is Debian 12's python3 (the container image's): the lock holds soupsieve at 2.10 for it."""
    assert setup_probe_accepts(version)


@pytest.mark.parametrize("version", [(3, 10, 12), (3, 14, 0)])
def test_setup_refuses_other_pythons(version):
    assert not setup_probe_accepts(version)


def test_setup_without_a_supported_python_says_what_to_install(tmp_path):
    fake_python(tmp_path, "python3.11", "3.10.12", False)
    done = choose(tmp_path)
    assert done.returncode == 1
    assert "no python3.13, python3.12 or python3.11 on PATH" in done.stderr
    assert "PYTHON=" in done.stderr


def test_setup_refuses_the_python_it_is_given_when_unsupported(tmp_path):
    fake_python(tmp_path, "python3.10", "3.10.12", False)
    done = choose(tmp_path, python="python3.10")
    assert done.returncode == 1
    assert "3.10.12" in done.stderr and "need CPython 3.11, 3.12 or 3.13" in done.stderr


def test_setup_takes_the_python_it_is_given(tmp_path):
    fake_python(tmp_path, "python3.13", "3.13.1", True)
    fake_python(tmp_path, "mypython", "3.12.7", True)
    done = choose(tmp_path, python="mypython")
    assert done.returncode == 0 and "would use mypython (Python 3.12.7)" in done.stdout, done.stderr


# ------------------------------------------------------------------ where torch comes from
def probe(index: str) -> tuple[subprocess.CompletedProcess, float]:
    """Setup's one question to the PyTorch index (SETUP_PROBE_ONLY: it says where torch would come from, builds nothing)."""
    env = {**os.environ, "SETUP_PROBE_ONLY": "1", "PYTHON": sys.executable, "TORCH_CPU_INDEX": index,
           "no_proxy": "127.0.0.1,localhost", "NO_PROXY": "127.0.0.1,localhost"}
    env.pop("CUDA", None)
    start = time.perf_counter()
    done = subprocess.run(["/bin/bash", str(SETUP)], env=env, capture_output=True, text=True, timeout=60)
    return done, time.perf_counter() - start


def says_it_goes_to_pypi(done: subprocess.CompletedProcess, index: str) -> None:
    assert done.returncode == 0, done.stderr
    assert f"the PyTorch wheel index {index} cannot be reached" in done.stderr
    assert "PyPI's Linux torch is the CUDA 13.0 build" in done.stderr and "about 5.4 GB in .venv" in done.stderr
    assert "TORCH_CPU_INDEX=" in done.stderr  # and how to get the CPU build after all
    assert "would install torch from PyPI alone" in done.stdout


@contextlib.contextmanager
def silent_server():
    """A port that accepts connections and never answers (a firewall that drops, a stalled proxy)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}/whl/cpu"
    finally:
        server.close()


def test_setup_gives_an_index_that_never_answers_5_seconds():
    """pip retried an unreachable index for every package (155 retries, ~5 min); setup asks once, 5 s at most."""
    with silent_server() as index:
        done, seconds = probe(index)
    says_it_goes_to_pypi(done, index)
    assert "no answer within 5 s" in done.stderr
    assert seconds < 10, seconds


def test_setup_takes_a_refused_connection_at_once():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    index = f"http://127.0.0.1:{port}/whl/cpu"
    done, seconds = probe(index)
    says_it_goes_to_pypi(done, index)
    assert seconds < 5, seconds


@contextlib.contextmanager
def index_server(tmp_path: Path, with_torch: bool):
    """A local PEP 503 index (a mirror of the PyTorch CPU index), with a torch page or without one (a proxy's 404)."""
    if with_torch:
        (tmp_path / "whl" / "cpu" / "torch").mkdir(parents=True)
        (tmp_path / "whl" / "cpu" / "torch" / "index.html").write_text('<a href="torch-2.13.0+cpu.whl">torch</a>')
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/whl/cpu"
    finally:
        server.shutdown()
        server.server_close()


def test_setup_uses_an_index_that_lists_torch(tmp_path):
    with index_server(tmp_path, with_torch=True) as index:
        done, _ = probe(index)
    assert done.returncode == 0, done.stderr
    assert f"would install torch from {index}" in done.stdout and "cannot be reached" not in done.stderr


def test_setup_does_not_take_any_answer_for_the_index(tmp_path):
    """A proxy that answers every address with 404 is not the index: pip would fail on it too."""
    with index_server(tmp_path, with_torch=False) as index:
        done, _ = probe(index)
    says_it_goes_to_pypi(done, index)
    assert "HTTP 404" in done.stderr


def test_setup_installs_from_pypi_alone_when_the_index_is_unreachable():
    """Where the probe failed, no pip command of setup names the index (pip would retry it for every package)."""
    script = SETUP.read_text()
    branches = re.findall(r"say_unreachable \"\$why\"\n(.*?)\n", script)
    assert len(branches) == 2, branches  # CUDA, CPU
    for branch in branches:
        assert branch.strip().startswith("pip install -r requirements/torch-"), branch
        assert "index" not in branch, branch
    assert script.count('say_unreachable "$why"') == 3  # the probe hook, CUDA, CPU


# ------------------------------------------------------------------ every pin has a wheel
@pytest.fixture(scope="module")
def resolutions():
    wheels = load_wheels()
    targets = [(python, machine) for machine in wheels.PLATFORMS for python in wheels.PYTHONS]
    with ThreadPoolExecutor(max_workers=3) as pool:  # pip waits on the index most of the time
        found = dict(zip(targets, pool.map(lambda target: wheels.resolve(*target), targets)))
    if any(r.unreachable for r in found.values()):
        pytest.skip("the package index could not be reached: pin resolution not checked")
    return found


@pytest.mark.slow
@pytest.mark.parametrize("python", ["3.11", "3.12", "3.13"])
def test_every_pin_resolves_on_linux_x86_64(resolutions, python):
    result = resolutions[python, "x86_64"]
    assert result.ok, str(result)


@pytest.mark.slow
def test_the_readme_says_what_the_resolver_found_for_aarch64(resolutions):
    readme = (REPO / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| Linux aarch64"))
    all_resolve = all(resolutions[python, "aarch64"].ok for python in ("3.11", "3.12", "3.13"))
    failing = [str(r) for (python, machine), r in resolutions.items() if machine == "aarch64" and not r.ok]
    assert ("every pin resolves" in row) == all_resolve, f"README says {row!r}; the resolver: {failing}"


def _resolve_only(requirement, tmp_path, monkeypatch):
    """tools/wheels.py's verdict for Python 3.12 on x86-64 with `requirement` as the whole lock (skips offline)."""
    wheels = load_wheels()
    lock = tmp_path / "requirements.txt"
    lock.write_text(requirement + "\n")
    monkeypatch.setattr(wheels, "REQUIREMENTS", [str(lock)])
    result = wheels.resolve("3.12", "x86_64")
    if result.unreachable:
        pytest.skip("the package index could not be reached")
    return result


def test_a_pin_without_a_wheel_is_reported(tmp_path, monkeypatch):
    """The resolver check can fail: a requirement that exists for no Python is named."""
    result = _resolve_only("torch==0.0.1", tmp_path, monkeypatch)
    assert not result.ok and "torch==0.0.1" in result.missing


def test_a_yanked_pin_is_reported(tmp_path, monkeypatch):
    """soupsieve 3.0.1 is yanked (broken on 3.11.0-3.11.4): pip installs it with a warning; the check fails."""
    result = _resolve_only("soupsieve==3.0.1", tmp_path, monkeypatch)
    assert not result.ok and result.missing.startswith("soupsieve==3.0.1 is yanked: Python < 3.11.5"), result
