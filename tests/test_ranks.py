"""Persistent ranks (course_lib.Ranks, %%distributed) as a learner uses them: in a real Jupyter kernel."""
from __future__ import annotations

import os
import signal
import stat
import time

import psutil
import pytest

from course_lib import LaunchError, Ranks

from conftest import Kernel
from test_launch import _no_ranks_left, _ranks_of


@pytest.fixture(scope="module")
def live():
    """A kernel with 2 live ranks (module-scoped: starting ranks is the slow part)."""
    k = Kernel()
    cell = k.run("import course_lib\nfrom course_lib import Ranks, LaunchError\nranks = Ranks(world_size=2)")
    assert cell.error is None, cell.evalue
    try:
        yield k
    finally:
        k.close()


def test_names_persist_between_cells_and_reach_functions(live):
    cell = live.run(
        "%%distributed\n"
        "import torch, torch.distributed as dist\n"
        "table = torch.arange(4.0) + 10 * dist.get_rank()\n"
        "print('built', table.tolist())\n"
    )
    assert cell.error is None, cell.evalue
    assert "[rank 0] built [0.0, 1.0, 2.0, 3.0]\n" in cell.stdout
    assert "[rank 1] built [10.0, 11.0, 12.0, 13.0]\n" in cell.stdout
    cell = live.run(
        "offset = 100                  # a notebook name: travels with the function\n"
        "def total_plus_offset():\n"
        "    global grand\n"
        "    t = table.sum()          # a rank name, set by the %%distributed cell above\n"
        "    dist.all_reduce(t)\n"
        "    grand = t.item() + offset\n"
        "    return grand\n"
        "print(ranks.run(total_plus_offset))\n"
        "print(ranks.pull('grand'), ranks.pull('table.shape[0]'))\n"
    )
    assert cell.error is None, cell.evalue
    assert cell.stdout.splitlines() == ["[152.0, 152.0]", "[152.0, 152.0] [4, 4]"]  # 6 + 46 + 100
    cell = live.run("%%distributed\ngrand - offset if 'offset' in dir() else grand")
    assert "[rank 0] Out: 152.0" in cell.stdout  # `offset` was not left behind on the ranks


def test_a_trivial_cell_round_trip_is_fast(live):
    cell = live.run(
        "import time, statistics\n"
        "ts = []\n"
        "for _ in range(100):\n"
        "    t = time.perf_counter(); ranks.execute('1'); ts.append(time.perf_counter() - t)\n"
        "print(statistics.median(ts))\n"
    )
    assert float(cell.stdout) < 0.010


def test_an_error_that_every_rank_survives_keeps_state(live):
    live.run("%%distributed\nkept = dist.get_rank()")
    cell = live.run("%%distributed\nif dist.get_rank() == 1:\n    raise KeyError('missing feature')")
    assert cell.ename == "LaunchError"
    assert "state is kept" in cell.evalue and "rank 1 raised KeyError" in cell.evalue
    assert "raise KeyError('missing feature')" in cell.evalue  # the cell's own line, from the rank
    assert live.run("print(ranks.pull('kept'))").stdout == "[0, 1]\n"


def test_a_rank_failing_before_a_collective_restarts_the_group(live):
    live.run("%%distributed\nlost = 1")
    cell = live.run("%%distributed\nif dist.get_rank() == 1:\n    raise RuntimeError('bad')\ndist.barrier()")
    assert cell.ename == "LaunchError"
    assert "state was lost" in cell.evalue
    assert "names set on them before are gone" in cell.stderr
    again = live.run("print(ranks.pull('lost'))")
    assert again.ename == "LaunchError" and "NameError" in again.evalue
    assert live.run("print(ranks.run(lambda: 7))").stdout == "[7, 7]\n"  # the new group works


def test_a_hanging_cell_is_ended_by_its_timeout(live):
    cell = live.run("%%distributed timeout=1\nimport time\ntime.sleep(300)")
    assert cell.ename == "LaunchError" and "timed out after 1 s" in cell.evalue
    assert cell.seconds < 15
    assert live.run("print(ranks.run(lambda: 'up'))").stdout == "['up', 'up']\n"


def test_interrupt_keeps_state_when_ranks_stop(live):
    live.run("%%distributed\nimport time, torch.distributed as dist\nsurvivor = 5")
    cell = live.run("%%distributed\nprint('sleeping', flush=True)\ntime.sleep(300)", interrupt_when="sleeping")
    assert cell.ename == "KeyboardInterrupt"
    assert "kept its state" in cell.stderr
    assert live.run("print(ranks.pull('survivor'))").stdout == "[5, 5]\n"


def test_interrupt_restarts_ranks_stuck_in_a_collective(live):
    cell = live.run(
        "%%distributed\nprint('waiting', flush=True)\nif dist.get_rank() == 0:\n    dist.barrier()\nelse:\n    time.sleep(300)",
        interrupt_when="waiting",
    )
    assert cell.ename == "KeyboardInterrupt"
    assert "did not stop on interrupt" in cell.stderr
    assert live.run("print(ranks.run(lambda: 1))").stdout == "[1, 1]\n"


def test_reset_magic_and_channel_is_a_private_unix_socket(live):
    cell = live.run(
        "import os, stat\n"
        "path = os.path.join(ranks.workdir, 'control.sock')\n"
        "print(stat.S_ISSOCK(os.stat(path).st_mode), oct(os.stat(ranks.workdir).st_mode & 0o777))\n"
    )
    assert cell.stdout == "True 0o700\n"
    live.run("%%distributed\nbefore_reset = 1")
    assert "restarted 2 ranks" in live.run("%dist_reset").stdout
    assert "NameError" in live.run("ranks.pull('before_reset')").evalue


def test_close_leaves_nothing_and_closed_ranks_say_so():
    k = Kernel()
    try:
        k.run("from course_lib import Ranks\nr = Ranks(world_size=2)\nwd = r.workdir")
        assert len(_ranks_of(k.pid)) == 2
        cell = k.run("r.close()\nimport os\nprint(os.path.exists(wd))\nr.pull('1')")
        assert cell.stdout == "False\n"
        assert cell.ename == "RuntimeError" and "closed" in cell.evalue
        assert _no_ranks_left(k.pid) == []
        # a killed kernel takes live ranks with it
        k.run("r2 = Ranks(world_size=2)")
        doomed = _ranks_of(k.pid) + psutil.Process(k.pid).children()
        os.kill(k.pid, signal.SIGKILL)
        _, alive = psutil.wait_procs(doomed, timeout=10)
        assert alive == []
    finally:
        k.close()


def test_bad_input_fails_at_once():
    with pytest.raises(ValueError, match="unknown backend"):
        Ranks(backend="mpi")
    with pytest.raises(ValueError, match="one GPU per rank"):
        Ranks(world_size=64, backend="nccl")
    with pytest.raises(ValueError, match="at least 1"):
        Ranks(world_size=0)
