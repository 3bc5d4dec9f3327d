"""Live progress from launched ranks: one bar in the launching cell, fed by rank 0.

Inside a function run by ``launch()`` (or ``Ranks.run``)::

    from course_lib.launcher import progress
    for step in range(steps):
        loss = train_step()
        progress.report(step + 1, steps, desc="train", loss=loss)

Rank 0's reports travel through a file in the launch's private folder; the kernel draws them as a tqdm
notebook bar (step, metrics, throughput) while the ranks run. Without a notebook front-end (plain Python,
nbval, ``COURSE_PROGRESS=text``) the kernel prints a few plain lines instead (start, every quarter, end).
Under torchrun (no launcher) rank 0 prints those plain lines itself.
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

ENV_FILE = "COURSE_PROGRESS_FILE"
FILE_NAME = "progress.jsonl"
_QUARTERS = (0.25, 0.5, 0.75, 1.0)
_torchrun_state: dict[str, Any] = {}


def report(step: int, total: int, desc: str = "progress", rank0_only: bool = True, **metrics: float) -> None:
    """Report that `step` of `total` steps are done, with metrics such as ``loss=0.69``."""
    rank = int(os.environ.get("RANK", "0"))
    if rank0_only and rank != 0:
        return
    record = {
        "step": int(step),
        "total": int(total),
        "desc": desc,
        "metrics": {k: float(v) for k, v in metrics.items()},
        "time": time.time(),  # when the rank reported: the kernel reads reports in batches, later
    }
    path = os.environ.get(ENV_FILE)
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        return
    # No launcher: rank 0 prints plain lines itself. A new run (steps start again, or another bar) gets a
    # fresh view, so a second training loop in the same process reports from its start too.
    view = _torchrun_state.get("view")
    if view is None or view.finished(record):
        view = _torchrun_state["view"] = _TextView()
    view.update(record)


def _metrics_text(metrics: dict[str, float]) -> str:
    return " ".join(f"{k}={v:.4f}" for k, v in metrics.items())


class _TextView:
    """A few plain lines: the first report, each quarter crossed, and the end."""

    def __init__(self) -> None:
        self.first: tuple[int, float] | None = None  # step and time of the first report: the rate counts from it
        self.printed: set[float] = set()
        self.started = False
        self.last: tuple[str, int, int] | None = None  # desc, total, step of the last report

    def finished(self, record: dict[str, Any]) -> bool:
        """Whether `record` belongs to a new run rather than continuing this one."""
        if self.last is None:
            return False
        desc, total, step = self.last
        return record["desc"] != desc or record["total"] != total or record["step"] <= step

    def update(self, record: dict[str, Any]) -> None:
        self.last = (record["desc"], record["total"], record["step"])
        step, total = record["step"], max(1, record["total"])
        marks = [q for q in _QUARTERS if step / total >= q and q not in self.printed]
        if not self.started or marks:
            self.started = True
            self.printed.update(marks)
            now = float(record.get("time", time.time()))
            if self.first is None:
                # The first report comes when the first step has ended, and the view cannot know when that
                # step began: a rate counted from here would be a step over no time. Rates start after it.
                self.first = (step, now)
            first_step, first_time = self.first
            rate = f" {(step - first_step) / (now - first_time):.1f} it/s" if step > first_step and now > first_time else ""
            print(
                f"{record['desc']}: step {step}/{record['total']} ({100 * step // total}%) "
                f"{_metrics_text(record['metrics'])}{rate}".replace("  ", " "),
                flush=True,
            )

    def close(self) -> None:
        pass


class _WidgetView:
    """A tqdm notebook bar in the launching cell."""

    def __init__(self) -> None:
        from tqdm.notebook import tqdm

        self.tqdm = tqdm
        self.bar: Any = None

    def update(self, record: dict[str, Any]) -> None:
        if self.bar is None:
            self.bar = self.tqdm(total=record["total"], desc=record["desc"], unit="step")
        self.bar.n = record["step"]
        self.bar.set_postfix({k: f"{v:.4f}" for k, v in record["metrics"].items()}, refresh=False)
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _has_notebook_frontend() -> bool:
    if os.environ.get("COURSE_PROGRESS", "").lower() == "text":
        return False
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is None or not hasattr(shell, "kernel"):
        return False
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return False
    return True


class ProgressReader:
    """Kernel side: follows a launch's progress file and draws it (widget or plain lines)."""

    def __init__(self, workdir: str) -> None:
        self.path = os.path.join(workdir, FILE_NAME)
        self.offset = 0
        self.partial = ""
        self.view: Any = None

    def poll(self) -> None:
        try:
            with open(self.path, encoding="utf-8") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return
        if not data:
            return
        self.offset += len(data.encode("utf-8"))
        lines = (self.partial + data).split("\n")
        self.partial = lines.pop()
        for line in lines:
            if not line.strip():
                continue
            record = json.loads(line)
            if self.view is None:
                self.view = _WidgetView() if _has_notebook_frontend() else _TextView()
            self.view.update(record)

    def close(self) -> None:
        self.poll()
        if self.view is not None:
            self.view.close()
            self.view = None
