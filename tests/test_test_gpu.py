"""`make test-gpu` (tools/test_gpu.py): it refuses at once without GPUs, and its notebook runner really runs
notebooks under COURSE_BACKEND=nccl and reports the backends their launches used."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from conftest import REPO

spec = importlib.util.spec_from_file_location("test_gpu_tool", REPO / "tools" / "test_gpu.py")
tool = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
sys.modules["test_gpu_tool"] = tool
spec.loader.exec_module(tool)  # type: ignore[union-attr]


def fake_nvidia_smi(tmp_path: Path, lines: list[str]) -> dict[str, str]:
    """An environment whose PATH has an nvidia-smi that lists ``lines`` (and the real tools after it)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "nvidia-smi"
    body = "".join(f"echo '{line}'\n" for line in lines)
    exe.write_text(f"#!/bin/sh\n{body}")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}


def preflight(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPO / "tools" / "test_gpu.py"), "preflight"],
                          env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has an NVIDIA driver")
def test_make_test_gpu_refuses_at_once_here() -> None:
    start = time.perf_counter()
    proc = subprocess.run(["make", "-s", "test-gpu"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "nvidia-smi not found" in proc.stderr
    assert "at least 2 NVIDIA GPUs" in proc.stderr and "make test" in proc.stderr
    assert "setup:" not in proc.stdout + proc.stderr  # it stopped before building anything
    assert time.perf_counter() - start < 30


def test_preflight_wants_two_gpus(tmp_path: Path) -> None:
    one = preflight(fake_nvidia_smi(tmp_path, ["0, NVIDIA H100 80GB HBM3, 81559 MiB"]))
    assert one.returncode == 2
    assert "found 1 GPU(s) (0, NVIDIA H100 80GB HBM3, 81559 MiB)" in one.stderr
    assert "at least 2 NVIDIA GPUs" in one.stderr


def test_preflight_passes_with_two_gpus(tmp_path: Path) -> None:
    two = preflight(fake_nvidia_smi(tmp_path, ["0, NVIDIA A10G, 23028 MiB", "1, NVIDIA A10G, 23028 MiB"]))
    assert two.returncode == 0, two.stderr
    assert two.stdout.startswith("test-gpu: 2 GPUs: 0, NVIDIA A10G")


def test_run_refuses_a_machine_without_gpus() -> None:
    """With the CPU build (setup's) or PyPI's CUDA build (setup's where only PyPI is reachable), on no GPU."""
    import torch

    proc = subprocess.run([sys.executable, str(REPO / "tools" / "test_gpu.py"), "run"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    if torch.version.cuda is None:
        assert "(CPU build) sees 0 GPU(s)" in proc.stderr and "make clean test-gpu" in proc.stderr
    else:
        assert f"(CUDA {torch.version.cuda} build) sees 0 GPU(s)" in proc.stderr and "nvidia-smi" in proc.stderr


def test_backend_summary_and_table(tmp_path: Path) -> None:
    log = tmp_path / "nb.jsonl"
    assert tool.backend_summary(log) == "no launch"
    records = [("nccl", 2), ("gloo", 4), ("nccl", 2), ("gloo", 4), ("nccl", 2)]
    log.write_text("".join(json.dumps({"backend": b, "world_size": n}) + "\n" for b, n in records))
    assert tool.backend_summary(log) == "nccl ×3, gloo (4 ranks) ×2"
    text = tool.table([tool.Row("04_dmp", "nccl ×3", True, 41.2), tool.Row("06_fsdp", "gloo (4 ranks) ×2", False, 9.6)])
    assert "| 04_dmp | nccl ×3 | passed | 41 s |" in text
    assert "| 06_fsdp | gloo (4 ranks) ×2 | FAILED | 10 s |" in text
    assert text.endswith("1 of 2 passed in 51 s; failed: 06_fsdp")


def _notebook(path: Path, *cells: str) -> Path:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nbformat.write(nb, path)
    return path


def test_run_notebook_runs_it_with_the_nccl_switch(tmp_path: Path) -> None:
    # No GPU here, so COURSE_BACKEND=nccl falls back to gloo for 2 ranks: the log shows what really ran.
    ok = _notebook(tmp_path / "ok.ipynb", "import os\nfrom course_lib import launch",
                   "assert os.environ['COURSE_BACKEND'] == 'nccl'\nlaunch(lambda: 1)")
    bad = _notebook(tmp_path / "bad.ipynb", "raise RuntimeError('cell 1 broke')")
    row = tool.run_notebook(ok, tmp_path)
    assert row.passed, row.detail
    assert row.backends == "gloo (2 ranks) ×1"
    failed = tool.run_notebook(bad, tmp_path)
    assert not failed.passed and "cell 1 broke" in failed.detail and failed.backends == "no launch"
    assert "COURSE_BACKEND" not in os.environ  # the switch is set for the kernel only
