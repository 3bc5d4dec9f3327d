"""`make test-gpu`: verify the course on a GPU node, with NCCL, in one command.

    python3 tools/test_gpu.py preflight      # standard library only: stops at once without 2 NVIDIA GPUs
    .venv/bin/python tools/test_gpu.py run   # the launcher's GPU tests, then every solution notebook

`make test-gpu` runs the preflight, builds the CUDA ``.venv`` (``CUDA=cu126`` unless given), then ``run``.
``run`` sets ``COURSE_BACKEND=nccl``, so every ``launch()`` and ``Ranks()`` of the unchanged notebooks that
names no backend runs on NCCL (a launch with more ranks than GPUs falls back to gloo and says so), and it
executes each notebook's GPU-only cells (fused Adam on CUDA, peak CUDA memory) that the CPU run skips.
Outputs are not compared with the stored CPU outputs (timings and memory differ on GPUs): a notebook passes
when every cell runs. Each launch appends its backend to ``$COURSE_BACKEND_LOG``; the table counts them.

The table is printed and written to ``test-gpu-report.md`` (ignored by git); the exit status is 1 when
anything failed, 2 when the machine cannot run the check at all.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MIN_GPUS = 2
NEEDS = (
    f"make test-gpu needs a machine with at least {MIN_GPUS} NVIDIA GPUs, their driver (nvidia-smi) and "
    "Python 3.11, 3.12 or 3.13; it then builds the CUDA .venv (CUDA=cu126, or e.g. `make test-gpu CUDA=cu128`) and runs "
    "every notebook on NCCL. On a laptop or a CPU CI machine run `make test` instead."
)


def gpus_from_nvidia_smi() -> tuple[list[str] | None, str]:
    """The GPUs ``nvidia-smi`` lists (``None`` when it is missing or fails) and why, in words."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None, "nvidia-smi not found: no NVIDIA driver on this machine"
    try:
        out = subprocess.run(
            [exe, "--query-gpu=index,name,memory.total", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"nvidia-smi failed: {e}"
    if out.returncode != 0:
        return None, f"nvidia-smi failed: {(out.stderr or out.stdout).strip().splitlines()[:1]}"
    return [line.strip() for line in out.stdout.splitlines() if line.strip()], "nvidia-smi"


def preflight() -> int:
    """0 when this machine has at least two NVIDIA GPUs; else say what is needed and return 2."""
    gpus, how = gpus_from_nvidia_smi()
    if gpus is None:
        print(f"test-gpu: {how}.\n{NEEDS}", file=sys.stderr)
        return 2
    if len(gpus) < MIN_GPUS:
        found = "; ".join(gpus) or "none"
        print(f"test-gpu: found {len(gpus)} GPU(s) ({found}).\n{NEEDS}", file=sys.stderr)
        return 2
    print(f"test-gpu: {len(gpus)} GPUs: " + "; ".join(gpus))
    return 0


@dataclass
class Row:
    """One line of the report: what ran, on which backends, whether it passed, and how long it took."""

    name: str
    backends: str
    passed: bool
    seconds: float
    detail: str = ""


def backend_summary(log: Path) -> str:
    """``"nccl ×5, gloo ×1 (4 ranks)"``: the launches a run logged, by backend (and world size for gloo)."""
    if not log.exists():
        return "no launch"
    counts: collections.Counter[str] = collections.Counter()
    for line in log.read_text().splitlines():
        rec = json.loads(line)
        counts[f"{rec['backend']}" if rec["backend"] == "nccl" else f"{rec['backend']} ({rec['world_size']} ranks)"] += 1
    if not counts:
        return "no launch"
    return ", ".join(f"{k} ×{n}" for k, n in sorted(counts.items(), key=lambda kv: (not kv[0].startswith("nccl"), kv[0])))


def table(rows: list[Row]) -> str:
    """The report as a Markdown table, with a last line that totals it."""
    lines = ["| notebook / tests | backend (launches) | result | time |", "|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.name} | {r.backends} | {'passed' if r.passed else 'FAILED'} | {r.seconds:.0f} s |")
    failed = [r.name for r in rows if not r.passed]
    total = sum(r.seconds for r in rows)
    lines.append("")
    lines.append(f"{len(rows) - len(failed)} of {len(rows)} passed in {total:.0f} s"
                 + (f"; failed: {', '.join(failed)}" if failed else "."))
    return "\n".join(lines)


def _env_for(log: Path) -> dict[str, str]:
    return {**os.environ, "COURSE_BACKEND": "nccl", "COURSE_BACKEND_LOG": str(log), "COURSE_PROGRESS": "text"}


def run_gpu_tests(workdir: Path) -> Row:
    """``pytest -m gpu tests``: the launcher's and the library's NCCL tests."""
    log = workdir / "tests.jsonl"
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-m", "gpu", "tests"],
        cwd=REPO, env=_env_for(log), capture_output=True, text=True,
    )
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or [""]
    return Row("tests (pytest -m gpu)", backend_summary(log), proc.returncode == 0,
               time.perf_counter() - start, tail[0] if proc.returncode else "")


def run_notebook(path: Path, workdir: Path, cell_timeout: int = 900) -> Row:
    """Execute one solution notebook top to bottom with NCCL (nothing is written back)."""
    import nbformat
    from nbclient import NotebookClient

    log = workdir / f"{path.stem}.jsonl"
    old = dict(os.environ)
    os.environ.update(_env_for(log))  # the kernel inherits this process's environment
    start = time.perf_counter()
    detail = ""
    try:
        nb = nbformat.read(path, as_version=4)
        NotebookClient(nb, timeout=cell_timeout, kernel_name="python3",
                       resources={"metadata": {"path": str(path.parent)}}).execute()
        passed = True
    except Exception as e:  # CellExecutionError carries the cell's traceback
        passed = False
        detail = "\n".join(str(e).strip().splitlines()[-12:])
    finally:
        os.environ.clear()
        os.environ.update(old)
    return Row(path.stem, backend_summary(log), passed, time.perf_counter() - start, detail)


def run(notebooks: list[str] | None = None) -> int:
    """Run the GPU tests and every solution notebook with NCCL; print and save the table."""
    import torch

    if torch.version.cuda is None or torch.cuda.device_count() < MIN_GPUS:
        build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "CPU build"
        where = ("If the GPUs are there, the .venv is the CPU one: `make clean test-gpu`." if torch.version.cuda is None
                 else "If the GPUs are there, check `nvidia-smi` and CUDA_VISIBLE_DEVICES.")
        print(f"test-gpu: torch {torch.__version__} ({build}) sees {torch.cuda.device_count()} GPU(s).\n{NEEDS}\n{where}",
              file=sys.stderr)
        return 2
    paths = [REPO / "solutions" / n for n in notebooks] if notebooks else sorted((REPO / "solutions").glob("*.ipynb"))
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="test-gpu-") as tmp:
        work = Path(tmp)
        rows.append(run_gpu_tests(work))
        print(f"test-gpu: {rows[-1].name}: {'passed' if rows[-1].passed else 'FAILED'}", flush=True)
        for path in paths:
            rows.append(run_notebook(path, work))
            r = rows[-1]
            print(f"test-gpu: {r.name}: {'passed' if r.passed else 'FAILED'} in {r.seconds:.0f} s ({r.backends})",
                  flush=True)
    report = table(rows)
    header = (f"# make test-gpu: torch {torch.__version__}, {torch.cuda.device_count()} × "
              f"{torch.cuda.get_device_name(0)}, COURSE_BACKEND=nccl\n\n")
    for r in rows:
        if r.detail:
            report += f"\n\n{r.name}:\n{r.detail}"
    print("\n" + header + report)
    (REPO / "test-gpu-report.md").write_text(header + report + "\n")
    return 0 if all(r.passed for r in rows) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/test_gpu.py", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("preflight", help="stop at once unless this machine has 2 NVIDIA GPUs")
    run_p = sub.add_parser("run", help="run the GPU tests and the notebooks with NCCL")
    run_p.add_argument("notebooks", nargs="*", help="solution notebook file names (default: all)")
    args = parser.parse_args(argv)
    return preflight() if args.command == "preflight" else run(args.notebooks)


if __name__ == "__main__":
    sys.exit(main())
