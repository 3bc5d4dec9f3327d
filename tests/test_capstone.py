"""The capstone trains on 2 ranks under launch() and under two torchrun "nodes", and memory scales as the formulas say."""
from __future__ import annotations

import os

import pytest

from course_lib import capstone, launch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_train_learns_and_the_ranks_agree():
    results = launch(capstone.train, 40, 512, 40_000, show_ranks=[])
    assert [r["rank"] for r in results] == [0, 1]
    first = results[0]
    assert first["world_size"] == 2 and first["steps"] == 40
    assert first["last_loss"] < first["first_loss"]
    assert results[0]["auc"] == results[1]["auc"] > 0.6  # the AUC of all ranks' scores, on every rank
    assert first["auc"] < first["optimal_auc"]


def test_train_resumes_from_its_last_checkpoint_as_if_never_stopped(tmp_path):
    plain = launch(capstone.train, 20, 256, 20_000, show_ranks=[])
    assert "resumed_from" not in plain[0]  # without a checkpoint_dir, lab 09's job and its dict are unchanged
    cut = launch(capstone.train, 10, 256, 20_000, 0, str(tmp_path), 5, show_ranks=[])  # a job that stops at 10
    assert [r["resumed_from"] for r in cut] == [0, 0]
    assert sorted(os.listdir(tmp_path)) == ["step_000005", "step_000010"]
    resumed = launch(capstone.train, 20, 256, 20_000, 0, str(tmp_path), 5, show_ranks=[])  # submitted again
    assert [(r["resumed_from"], r["steps"]) for r in resumed] == [(10, 20), (10, 20)]
    assert resumed[0]["checkpoint"] == str(tmp_path / "step_000020")
    for before, after in zip(plain, resumed):  # the last 10 steps and the model match the uninterrupted run's
        assert (after["last_loss"], after["auc"]) == (before["last_loss"], before["auc"])


def test_two_torchrun_nodes_on_one_machine():
    port = capstone.free_port()
    commands = [
        ["torchrun", "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(node), "--master-addr", "127.0.0.1",
         "--master-port", str(port), "-m", "course_lib.run", "course_lib.capstone:train", "10", "256", "20000"]
        for node in (0, 1)
    ]
    outputs = capstone.run_nodes(commands, timeout=240, cwd=REPO)
    values = [capstone.returned(out) for out in outputs]
    assert [len(v) for v in values] == [1, 1]
    assert [(v[0]["node"], v[0]["rank"], v[0]["world_size"]) for v in values] == [(0, 0, 2), (1, 1, 2)]
    assert values[0][0]["auc"] == values[1][0]["auc"]


def test_run_nodes_reports_a_failing_node():
    with pytest.raises(RuntimeError, match="node 1 exited with 3"):
        capstone.run_nodes([["true"], ["sh", "-c", "echo broken; exit 3"]], timeout=30)


def test_returned_reads_what_course_lib_run_printed():
    text = "noise\n[course_lib.run] rank 1/2 (gloo) returned: {'auc': 0.75, 'rank': 1}\n"
    assert capstone.returned(text) == [{"auc": 0.75, "rank": 1}]


def test_memory_scaling_matches_the_formulas():
    frame = capstone.memory_scaling((1, 2), num_embeddings=1000)
    assert list(frame.index) == [1, 2]
    assert frame["tables x formula"].tolist() == [1.0, 1.0]
    assert frame["FSDP x formula"].between(0.99, 1.01).all()
    assert frame.loc[2, "tables MiB/rank"] == pytest.approx(frame.loc[1, "tables MiB/rank"] / 2)
