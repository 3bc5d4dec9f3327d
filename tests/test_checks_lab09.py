"""The 09_scale checks accept the solutions and reject plausible wrong answers."""
from __future__ import annotations

import pytest

from course_lib.checks import CheckFailed, lab09


def test_load_factor_check_accepts_the_largest_that_fits(capsys):
    lab09.check_load_factor(0.75)
    assert capsys.readouterr().out.startswith("✓")


@pytest.mark.parametrize(
    "answer, words",
    [
        (1.0, "finds no plan"),  # cache everything: the whole table in HBM again
        (0.9, "finds no plan"),
        (0.25, "so does 0.5"),  # fits, but wastes HBM
        (0.3, "not one of the load factors"),
    ],
)
def test_load_factor_check_rejects_wrong_answers(answer, words):
    with pytest.raises(CheckFailed, match=words):
        lab09.check_load_factor(answer)


def lookup_solution(num_ids, embedding_dim, seconds, bytes_per_element=4):
    return num_ids * embedding_dim * bytes_per_element / seconds / 1e9


def test_lookup_check_accepts_the_solution(capsys):
    lab09.check_lookup_bandwidth(lookup_solution)
    assert capsys.readouterr().out.startswith("✓")


@pytest.mark.parametrize(
    "wrong, words",
    [
        (lambda n, d, s, e=4: n * d / s / 1e9, "bytes_per_element bytes"),  # elements, not bytes
        (lambda n, d, s, e=4: 2 * n * d * e / s / 1e9, "nothing is written"),  # counted like a copy
        (lambda n, d, s, e=4: n * d * e / s / 2**30, "decimal"),  # GiB/s
        (lambda n, d, s, e=4: n * d * e / (s * 1e3) / 1e9, "seconds are seconds"),
        (lambda n, d, s, e=4: "fast", "return a number"),
    ],
)
def test_lookup_check_rejects_wrong_answers(wrong, words):
    with pytest.raises(CheckFailed, match=words):
        lab09.check_lookup_bandwidth(wrong)


def torchrun_solution(nnodes, nproc_per_node, node_rank, head, port):
    return ["torchrun", "--nnodes", str(nnodes), "--nproc-per-node", str(nproc_per_node), "--node-rank", str(node_rank),
            "--master-addr", head, "--master-port", str(port), "-m", "course_lib.run", "course_lib.capstone:train"]


def test_torchrun_check_accepts_the_solution(capsys):
    lab09.check_torchrun_command(torchrun_solution)
    assert capsys.readouterr().out.startswith("✓")


def world_size_per_node(nnodes, nproc, node_rank, head, port):
    return torchrun_solution(nnodes, nnodes * nproc, node_rank, head, port)


def no_node_rank(nnodes, nproc, node_rank, head, port):
    argv = torchrun_solution(nnodes, nproc, node_rank, head, port)
    i = argv.index("--node-rank")
    return argv[:i] + argv[i + 2:]


def script_not_module(nnodes, nproc, node_rank, head, port):
    return [a for a in torchrun_solution(nnodes, nproc, node_rank, head, port) if a != "-m"]


def one_string(nnodes, nproc, node_rank, head, port):
    return " ".join(torchrun_solution(nnodes, nproc, node_rank, head, port))


@pytest.mark.parametrize(
    "wrong, words",
    [
        (world_size_per_node, "one per local GPU"),
        (no_node_rank, "its own rank"),
        (script_not_module, "as a module"),
        (one_string, "list of strings|starts with"),
    ],
)
def test_torchrun_check_rejects_wrong_answers(wrong, words):
    with pytest.raises(CheckFailed, match=words):
        lab09.check_torchrun_command(wrong)
