"""course_lib.parallel2d: sharded sequence embeddings, the 2-D tower, activation checkpointing."""
from __future__ import annotations

import pytest

from course_lib import launch, parallel2d


@pytest.mark.parametrize("sharding", ["table_wise", "row_wise"])
def test_sharded_sequence_embeddings_equal_the_unsharded_module(sharding):
    out = launch(parallel2d.sequence_lookup, sharding, "fused", world_size=2, show_ranks=[])
    for r in out:
        assert r["max_diff"] == 0.0 and r["vectors"][0] == sum(r["lengths"])
        ops = sorted({(c.op, c.dtype) for c in r["records"]})
        assert ops == [("all_to_all", "float32"), ("all_to_all", "int64")]  # no reduce-scatter: nothing is pooled


def test_activation_checkpointing_saves_activations_and_recomputes():
    plain = launch(parallel2d.activation_report, False, seq_len=128, world_size=2, show_ranks=[])[0]
    ckpt = launch(parallel2d.activation_report, True, seq_len=128, world_size=2, show_ranks=[])[0]
    assert ckpt["saved_bytes"] < plain["saved_bytes"] / 4
    assert plain["calls_after_backward"] == [1, 1] and ckpt["calls_after_backward"] == [2, 2]
    assert plain["grad_diff"] < 1e-6 and ckpt["grad_diff"] < 1e-6
    longer = launch(parallel2d.activation_report, False, seq_len=256, world_size=2, show_ranks=[])[0]
    assert longer["saved_bytes"] > 1.8 * plain["saved_bytes"]  # activations grow with the sequence


def test_cpu_offload_needs_unpinned_memory_on_cpu():
    pinned = launch(parallel2d.activation_report, False, offload="pinned", world_size=2, show_ranks=[])[0]
    # the CPU build: "Cannot access accelerator device when none is available"; PyPI's CUDA build without a GPU:
    # "Found no NVIDIA driver on your system"
    assert "accelerator" in pinned["error"] or "NVIDIA driver" in pinned["error"], pinned["error"]
    unpinned = launch(parallel2d.activation_report, False, offload="unpinned", world_size=2, show_ranks=[])[0]
    assert unpinned["param_device"] == "cpu" and unpinned["grad_diff"] < 1e-6


def test_the_planner_prices_a_host_sized_sharding_group_cheaper_in_comms_and_dearer_in_memory():
    cluster, group = parallel2d.sharding_group_estimates((64, 8))
    assert (cluster["GPUs"], cluster["hosts"], group["GPUs"], group["hosts"]) == (64, 8, 8, 1)
    assert group["max HBM GiB per rank"] > 4 * cluster["max HBM GiB per rank"]
    assert group["busiest rank's comms ms"] < cluster["busiest rank's comms ms"] / 10


def test_the_gated_block_is_llamas_shape_with_the_tower_blocks_names():
    import torch

    block = parallel2d.GatedBlock(16, 2, 24)
    ff = block.feed_forward
    assert [n for n, _ in ff.named_children()] == ["w1", "w2", "w3"]  # registered in Llama's order
    x = torch.randn(2, 3, 16)
    assert torch.allclose(ff(x), ff.w2(torch.nn.functional.silu(ff.w1(x)) * ff.w3(x)))
    assert {n for n, _ in block.named_children()} == {n for n, _ in parallel2d.TowerBlock(16, 2, 24).named_children()}
    assert isinstance(parallel2d.Tower().layers[0], parallel2d.TowerBlock)  # the default is unchanged
    tower = parallel2d.Tower(dim=16, n_heads=2, hidden=24, block=parallel2d.GatedBlock)
    assert all(isinstance(layer, parallel2d.GatedBlock) for layer in tower.layers)
    assert tower(x).shape == x.shape
