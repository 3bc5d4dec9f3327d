"""What a learner has done: each exercise check records its verdict, and ``make progress`` shows them all.

A check run from a notebook writes one entry to ``.progress.json`` in the notebook's folder (``labs/`` for a
learner; git ignores the file and nothing leaves the machine): the verdict of the last run, when it ran, and
when the exercise last passed. ``COURSE_PROGRESS_FILE`` names another file (the tests use one of their own).

    python -m course_lib.progress            # or: make progress
    python -m course_lib.progress --labs labs --file labs/.progress.json

Each exercise is one of: **passed** (its last check passed), **tried** (its check ran on a written answer that
did not pass, including one that passed before and now fails), or **not started** (its check never ran, or ran
while the exercise was still unwritten). The list of exercises comes from the labs themselves: every
``labNN.check_...(`` call in a lab's code cells is one exercise, numbered in the order the lab runs them.

Nothing here imports torch: the command answers at once.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import os
import re
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

FILE_NAME = ".progress.json"
PASSED, FAILED, UNWRITTEN = "passed", "failed", "unwritten"
CHECK_CALL = re.compile(r"\blab(?P<lab>\d\d)\.(?P<check>check_\w+)\(")
_EXERCISE_TITLE = re.compile(r"^#+\s*Exercise\s+(?P<number>\d+)\s*[·:.-]?\s*(?P<title>.*)$", re.MULTILINE)


def progress_file() -> Path:
    """Where checks record their verdicts: ``$COURSE_PROGRESS_FILE``, else ``.progress.json`` in the current
    folder (a notebook kernel's folder is the notebook's own)."""
    return Path(os.environ.get("COURSE_PROGRESS_FILE") or Path.cwd() / FILE_NAME)


def _now() -> str:
    return _dt.datetime.now().isoformat(timespec="seconds")


def load(path: Path | None = None) -> dict:
    """The recorded verdicts, ``{lab: {check: entry}}``; empty when nothing was recorded or the file is unreadable."""
    path = path or progress_file()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock beside `path` (two kernels may check at once); no lock where fcntl is missing."""
    try:
        import fcntl
    except ImportError:  # Windows: a rare lost update is acceptable there
        yield
        return
    with open(str(path) + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def record(lab: str, check: str, verdict: str, answer: str = "", path: Path | None = None) -> dict | None:
    """Record `verdict` (passed, failed or unwritten) for `check` of `lab`; return the entry as it was before
    (None when the exercise had none). A file that cannot be written is skipped: progress never breaks a check."""
    path = path or progress_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with _locked(path):
            data = load(path)
            before = data.get(lab, {}).get(check)
            entry = dict(before or {})
            entry.update(verdict=verdict, last_run=_now(), answer=answer or entry.get("answer", ""))
            if verdict == PASSED:
                entry["last_passed"] = entry["last_run"]
            data.setdefault(lab, {})[check] = entry
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".progress-")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f, indent=1, sort_keys=True)
            os.replace(tmp, path)
            return before
    except OSError:
        return None


# ------------------------------------------------------------------------------------------- the exercises

@dataclass(frozen=True)
class Exercise:
    lab: str        # "08"
    notebook: str   # "08_checkpointing"
    number: int     # 1, 2, ... in the order the lab checks them
    check: str      # "check_save"
    answer: str     # what the check is handed: "save"
    title: str      # the exercise's heading, without "Exercise N ·"


def exercises(labs_dir: Path | str = "labs") -> list[Exercise]:
    """Every exercise of the labs in `labs_dir`, lab by lab, in the order each lab checks them."""
    found = []
    for path in sorted(Path(labs_dir).glob("[0-9][0-9]_*.ipynb")):
        nb = json.loads(path.read_text(encoding="utf-8"))
        title, number = "", 0
        for cell in nb["cells"]:
            source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            if cell["cell_type"] == "markdown":
                if (heading := _EXERCISE_TITLE.search(source)) is not None:
                    title = heading.group("title").strip()
                continue
            for call in CHECK_CALL.finditer(source):
                number += 1
                argument = source[call.end():].split(",")[0].split(")")[0].strip()
                found.append(Exercise(call.group("lab"), path.stem, number, call.group("check"), argument, title))
    return found


def _when(stamp: str | None) -> str:
    if not stamp:
        return ""
    try:
        return _dt.datetime.fromisoformat(stamp).strftime("%Y-%m-%d %H:%M")
    except ValueError:
        return stamp


def state(exercise: Exercise, data: dict) -> tuple[str, str]:
    """(passed | tried | not started, a short note) for `exercise` given the recorded `data`."""
    entry = data.get(exercise.lab, {}).get(exercise.check)
    if not entry:
        return "not started", ""
    verdict, last_passed = entry.get("verdict"), entry.get("last_passed")
    if verdict == PASSED:
        return "passed", f"last passed {_when(last_passed)}"
    if verdict == FAILED:
        note = f"fails now (last run {_when(entry.get('last_run'))})"
        return "tried", note + (f"; it passed {_when(last_passed)}" if last_passed else "")
    note = f"still unwritten at the last check ({_when(entry.get('last_run'))})"
    return "not started", note + (f"; it passed {_when(last_passed)}" if last_passed else "")


MARKS = {"passed": "✓", "tried": "✗", "not started": "·"}


def report(labs_dir: Path | str = "labs", path: Path | None = None) -> str:
    """The progress table ``make progress`` prints: per lab, each exercise's state, then the total."""
    data = load(path)
    all_exercises = exercises(labs_dir)
    lines, passed = [], 0
    for notebook in dict.fromkeys(e.notebook for e in all_exercises):
        mine = [e for e in all_exercises if e.notebook == notebook]
        states = [state(e, data) for e in mine]
        done = sum(1 for s, _ in states if s == "passed")
        passed += done
        lines.append(f"{notebook}: {done} of {len(mine)}")
        for exercise, (kind, note) in zip(mine, states):
            label = f"exercise {exercise.number}" + (f" · {exercise.title}" if exercise.title else "")
            lines.append(f"  {MARKS[kind]} {label[:60]:60} {kind:11} {note}".rstrip())
    lines.append(f"{passed} of {len(all_exercises)} exercises passed")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib.progress", description=__doc__.split("\n")[0])
    parser.add_argument("--labs", default="labs", help="the student notebooks (default: labs)")
    parser.add_argument("--file", type=Path, default=None,
                        help="the progress file (default: $COURSE_PROGRESS_FILE, else LABS/.progress.json)")
    args = parser.parse_args(argv)
    path = args.file or (Path(os.environ["COURSE_PROGRESS_FILE"]) if os.environ.get("COURSE_PROGRESS_FILE")
                         else Path(args.labs) / FILE_NAME)
    if not Path(args.labs).is_dir():
        print(f"progress: no folder {args.labs}/ here; run it from the course's folder or pass --labs", file=sys.stderr)
        return 2
    print(report(args.labs, path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
