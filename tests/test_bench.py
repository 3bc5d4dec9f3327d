"""course_lib.bench: the fused-EBC-vs-list timing returns real measurements of the same math."""
from __future__ import annotations

import torch

from course_lib import bench


def test_small_run_measures_every_contestant_and_agrees_on_weights():
    timing = bench.time_fused_vs_bags(num_tables=3, num_embeddings=50, embedding_dim=8, batch_size=16,
                                      steps=4, warmup=1, include_ebc=True)
    assert set(timing.seconds) == {bench.FUSED, bench.BAGS, bench.EBC}
    assert all(len(times) == 4 and all(t > 0 for t in times) for times in timing.seconds.values())
    assert timing.speedup == timing.median(bench.BAGS) / timing.median(bench.FUSED)
    # same initial weights, same batch, same SGD steps: the same result up to float rounding
    assert timing.max_weight_diff < 1e-5
    text = str(timing)
    assert "3 tables x 50 rows x dim 8, batch 16" in text and bench.EBC in text


def test_without_ebc_only_two_contestants():
    timing = bench.time_fused_vs_bags(num_tables=2, num_embeddings=20, embedding_dim=4, batch_size=8,
                                      steps=2, warmup=1)
    assert set(timing.seconds) == {bench.FUSED, bench.BAGS}


def test_str_says_slower_when_fused_loses():
    timing = bench.LookupTiming(num_tables=1, num_embeddings=1, embedding_dim=4, batch_size=1, ids_per_bag=1.0,
                                seconds={bench.FUSED: [2.0], bench.BAGS: [1.0]}, max_weight_diff=0.0)
    assert timing.speedup == 0.5
    assert "slower here: 2.0x" in str(timing)


def test_random_batch_is_key_major_within_table_sizes():
    tables = bench.make_tables(num_tables=3, num_embeddings=7, embedding_dim=4)
    kjt = bench.random_batch(tables, batch_size=5, ids_per_bag=2, generator=torch.Generator().manual_seed(1))
    assert kjt.keys() == ["f0", "f1", "f2"] and kjt.stride() == 5
    assert int(kjt.values().max()) < 7 and int(kjt.lengths().max()) <= 4
