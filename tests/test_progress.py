"""Live progress from launched ranks: a bar in a notebook, plain lines elsewhere."""
from __future__ import annotations

import os

from course_lib import launch
from course_lib.launcher import progress


def train(steps):
    import time

    import torch.distributed as dist

    for step in range(steps):
        time.sleep(0.01)
        progress.report(step + 1, steps, desc="train", loss=1.0 / (step + 1) + dist.get_rank())
    return "done"


def test_plain_lines_without_a_notebook(capsys, monkeypatch):
    monkeypatch.setenv("COURSE_PROGRESS", "text")
    assert launch(train, 8) == ["done", "done"]
    lines = [l for l in capsys.readouterr().out.splitlines() if l.startswith("train:")]
    assert [l.split(" it/s")[0].rsplit(" ", 1)[0] if "it/s" in l else l for l in lines] == [
        "train: step 1/8 (12%) loss=1.0000",
        "train: step 2/8 (25%) loss=0.5000",
        "train: step 4/8 (50%) loss=0.2500",
        "train: step 6/8 (75%) loss=0.1667",
        "train: step 8/8 (100%) loss=0.1250",
    ]  # rank 0 only (rank 1's loss would be 1 higher), every quarter, none lost however fast the steps
    # A rate needs a step that began after the first report: none on the first line, then at most 1 / 0.01 s.
    assert "it/s" not in lines[0]
    rates = [float(l.split(" it/s")[0].rsplit(" ", 1)[1]) for l in lines[1:]]
    assert all(0 < rate <= 110 for rate in rates), rates


def test_a_widget_bar_in_a_notebook_kernel(kernel):
    kernel.run("import os; os.environ.pop('COURSE_PROGRESS', None)\nfrom course_lib import launch\nfrom course_lib.launcher import progress")
    cell = kernel.run(
        "def train(steps):\n"
        "    import time\n"
        "    for step in range(steps):\n"
        "        time.sleep(0.05)\n"
        "        progress.report(step + 1, steps, desc='train', loss=0.5)\n"
        "launch(train, 10)\n"
    )
    assert cell.error is None, cell.evalue
    assert any("application/vnd.jupyter.widget-view+json" in d for d in cell.displays)
    assert "train: step" not in cell.stdout  # no carriage-return text from the ranks


def test_under_torchrun_rank0_prints_plain_lines(capsys, monkeypatch):
    monkeypatch.delenv(progress.ENV_FILE, raising=False)
    monkeypatch.setenv("RANK", "0")
    progress._torchrun_state.clear()
    for step in range(4):
        progress.report(step + 1, 4, desc="fit")
    assert capsys.readouterr().out.count("fit: step") == 5 - 1  # first (=25%), 50%, 75%, 100%
    monkeypatch.setenv("RANK", "1")
    progress.report(1, 4, desc="fit")
    assert capsys.readouterr().out == ""


def test_a_second_run_in_the_same_process_reports_from_its_start(capsys, monkeypatch):
    monkeypatch.delenv(progress.ENV_FILE, raising=False)
    monkeypatch.setenv("RANK", "0")
    for _ in range(2):
        for step in range(4):
            progress.report(step + 1, 4, desc="fit")
    assert capsys.readouterr().out.count("fit: step 1/4") == 2
