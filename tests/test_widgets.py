"""The plan explorer's logic (no browser): real planner calls, plain-words errors, a thin widget over it."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest
from torchrec import EmbeddingBagConfig

from course_lib.widgets import PlanExplorer, PlanRequest, plan_layout

TABLES = [
    EmbeddingBagConfig(name=f"t{i}", num_embeddings=n, embedding_dim=64, feature_names=[f"f{i}"])
    for i, n in enumerate([4_000_000, 1_000_000, 50_000])
]


def test_a_plan_for_a_gpu_cluster_honours_a_constraint():
    out = plan_layout(TABLES, PlanRequest(world_size=8, ranks_per_node=4, memory_gib=16, constraints={"t0": "row_wise"}))
    assert out.ok, out.error
    assert out.table.loc["t0", "sharding type"] == "row_wise"
    assert out.table.loc["t0", "shards"] == 8 and out.table.loc["t0", "shard shape"] == "500000 x 64"
    assert set(out.table.index) == {"t0", "t1", "t2"}
    assert len(out.figure.axes) == 1


def test_changing_a_control_changes_the_plan():
    a = plan_layout(TABLES, PlanRequest(world_size=8, constraints={"t1": "table_wise"}))
    b = plan_layout(TABLES, PlanRequest(world_size=8, constraints={"t1": "column_wise"}))
    assert a.table.loc["t1", "sharding type"] == "table_wise" and b.table.loc["t1", "sharding type"] == "column_wise"
    c = plan_layout(TABLES, PlanRequest(world_size=16, ranks_per_node=8))
    assert int(c.table["shards"].max()) > int(plan_layout(TABLES, PlanRequest(world_size=4, ranks_per_node=4)).table["shards"].max())


def test_an_impossible_request_is_explained_not_raised():
    out = plan_layout(TABLES, PlanRequest(world_size=2, ranks_per_node=2, memory_gib=0.01, compute_device="cpu"))
    assert not out.ok and out.table is None
    assert out.error.startswith("The planner cannot fit these tables: they need")
    assert "Traceback" not in out.error and "Add ranks" in out.error


def test_impossible_constraints_are_explained():
    out = plan_layout(TABLES, PlanRequest(world_size=2, ranks_per_node=2, memory_gib=0.001, compute_device="cpu", constraints={"t0": "column_wise"}))
    assert not out.ok and (out.error.startswith("The planner cannot satisfy") or out.error.startswith("The planner cannot fit"))


@pytest.mark.parametrize(
    "request_, words",
    [
        (PlanRequest(world_size=6, ranks_per_node=4), "multiple of the ranks per node"),
        (PlanRequest(constraints={"nope": "row_wise"}), "no table 'nope'"),
        (PlanRequest(compute_device="cpu", constraints={"t0": "row_wise"}), "not a sharding type the planner offers on cpu"),
    ],
)
def test_bad_requests_get_plain_answers(request_, words):
    out = plan_layout(TABLES, request_)
    assert not out.ok and words in out.error


def test_the_widget_is_a_thin_view_over_plan_layout():
    explorer = PlanExplorer(TABLES, PlanRequest(world_size=4, ranks_per_node=4))
    assert explorer.outcome.ok
    explorer.constraints["t0"].value = "column_wise"
    explorer.button.click()
    assert explorer.outcome.table.loc["t0", "sharding type"] == "column_wise"
    explorer.device.value = "cpu"
    assert "row_wise" not in explorer.constraints["t0"].options
    explorer.memory.value = 0.01
    explorer.button.click()
    assert not explorer.outcome.ok


def test_the_memory_plot_labels_small_tables_in_a_unit_that_fits():
    # KiB-sized tables used to be drawn in GiB (an axis that read 0.00025)
    small = [EmbeddingBagConfig(name=f"s{i}", num_embeddings=1_000, embedding_dim=16, feature_names=[f"s{i}"])
             for i in range(3)]
    ax = plan_layout(small, PlanRequest(world_size=2, ranks_per_node=2)).figure.axes[0]
    assert ax.get_ylabel() == "parameters (KiB)"  # 3 tables of 62.5 KiB on 2 ranks
    assert ax.get_ylim()[1] >= 1
    big = plan_layout(TABLES, PlanRequest(world_size=2, ranks_per_node=2)).figure.axes[0]
    assert big.get_ylabel() in ("parameters (MiB)", "parameters (GiB)")
