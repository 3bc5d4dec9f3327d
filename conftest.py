"""Repository-wide pytest setup (it also applies to the nbval run over solutions/)."""
import os

# Notebook kernels started by nbval have no browser attached: launched training loops report progress as a
# few plain text lines (deterministic, comparable with the stored outputs) rather than as a widget.
os.environ.setdefault("COURSE_PROGRESS", "text")

# A launch whose process group did not form (gloo's rare loopback failure) is started again and says so in one
# line; under nbval that line goes to this file instead of the cell, so a retried launch does not change a
# notebook's outputs. The end of the run says how many there were.
NOTICES = os.path.join(os.path.dirname(os.path.abspath(__file__)), ".pytest-launch-notices.log")
os.environ.setdefault("COURSE_LAUNCH_NOTICES", NOTICES)

# Exercise checks run in a notebook record their verdicts (course_lib.progress); a test run records them in a
# file of its own, never in a learner's labs/.progress.json.
import tempfile  # noqa: E402

os.environ["COURSE_PROGRESS_FILE"] = os.path.join(tempfile.mkdtemp(prefix="course-progress-"), ".progress.json")


def pytest_sessionstart(session):
    if os.path.exists(NOTICES):
        os.remove(NOTICES)


def pytest_terminal_summary(terminalreporter):
    if os.path.exists(NOTICES):
        with open(NOTICES) as f:
            lines = f.read().splitlines()
        terminalreporter.write_line(f"launcher: {len(lines)} launch(es) started their process group again "
                                    f"(lines in {os.path.basename(NOTICES)}):")
        for line in lines:
            terminalreporter.write_line(f"  {line}")


# A cell that prints figures floating-point order can move declares a tolerance ("# tolerance: ±0.002 (why)");
# this plugin makes nbval compare such cells' figures within it and everything else exactly.
pytest_plugins = ["course_lib.nbval_tolerance"]
