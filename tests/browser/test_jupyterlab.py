"""The labs in a real JupyterLab, driven by headless Chromium (run with `make test-browser`, or in `make test`)."""
from __future__ import annotations

import re
import time
from pathlib import Path

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


def test_plan_explorer_replans_when_a_control_changes(lab):
    start = time.monotonic()
    lab.open("03_sharding.ipynb")
    lab.run_until("PlanExplorer(TABLES", timeout_s=180)
    panel = lab.page.locator(".course-plan-explorer")
    panel.wait_for(timeout=60_000)
    table = panel.locator(".course-plan-table")
    table.wait_for(timeout=60_000)
    before_table = table.inner_text()
    before_plot = panel.locator("img").first.get_attribute("src")
    assert "user" in before_table
    lab.screenshot("03_sharding-plan-explorer-before")

    panel.locator(".widget-dropdown:has(label:text-is('user')) select").select_option("column_wise")
    panel.locator(".widget-text:has(label:text-is('ranks')) input").fill("16")
    panel.locator("button:has-text('Plan')").click()
    lab.page.wait_for_function(
        "before => { const t = document.querySelector('.course-plan-explorer .course-plan-table');"
        " return t && t.innerText !== before; }",
        arg=before_table,
        timeout=60_000,
    )
    after_table = table.inner_text()
    assert "column_wise" in after_table.split("user", 1)[1].splitlines()[0], after_table
    lab.page.wait_for_function(  # the plot is redrawn after the table
        "before => { const i = document.querySelector('.course-plan-explorer img'); return i && i.src !== before; }",
        arg=before_plot,
        timeout=60_000,
    )
    lab.screenshot("03_sharding-plan-explorer-after")

    panel.locator(".widget-text:has(label:text-is('GiB/rank')) input").fill("0.001")
    panel.locator("button:has-text('Plan')").click()
    error = panel.locator(".course-plan-error")
    error.wait_for(timeout=60_000)
    assert error.inner_text().startswith(("The planner cannot fit these tables", "The planner cannot satisfy"))
    assert "Traceback" not in panel.inner_text()
    lab.screenshot("03_sharding-plan-explorer-impossible")
    assert time.monotonic() - start < 300


@pytest.mark.skipif(not (Path(__file__).resolve().parents[2] / "labs" / "04_dmp.ipynb").exists(), reason="lab 04 not written yet")
def test_training_cell_shows_a_live_progress_bar_to_the_end(lab):
    start = time.monotonic()
    lab.use_solved("04_dmp.ipynb")  # a learner who has done the exercises
    lab.open("04_dmp.ipynb")
    index = lab.run_until("launch(train_and_evaluate, log)", timeout_s=180, wait_last=False)
    cell = lab.cells().nth(index)
    seen: list[tuple[int, int]] = []
    while lab.running() and time.monotonic() - start < 400:
        for text in cell.locator(".widget-html-content").all_inner_texts():
            match = re.search(r"(\d+)/(\d+)", text)
            if match and (not seen or seen[-1] != (int(match[1]), int(match[2]))):
                seen.append((int(match[1]), int(match[2])))
                if len(seen) == 2:
                    lab.screenshot("04_dmp-training-progress")
        lab.page.wait_for_timeout(200)
    lab.wait_idle(60)
    final = [int(m[1]) for t in cell.locator(".widget-html-content").all_inner_texts() for m in [re.search(r"(\d+)/(\d+)", t)] if m]
    total = seen[-1][1] if seen else 0
    assert len({s for s, _ in seen}) >= 3, f"the bar did not advance while training: {seen}"
    assert final and final[-1] == total > 0, f"the bar stopped at {final} of {total}"
    assert "train: step" not in cell.locator(".jp-OutputArea").inner_text()  # a bar, not text lines
    lab.screenshot("04_dmp-training-done")
