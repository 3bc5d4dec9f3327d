"""course_lib.bandwidth measures what it says: bytes moved per repetition, and a positive best time."""
from __future__ import annotations

import pytest
import torch

from course_lib import bandwidth


def test_lookup_bytes_is_ids_times_row_bytes():
    assert bandwidth.lookup_bytes(1000, 64) == 1000 * 64 * 4
    assert bandwidth.lookup_bytes(10, 128, bytes_per_element=2) == 10 * 128 * 2


def test_bandwidth_reports_decimal_gigabytes():
    b = bandwidth.Bandwidth("x", bytes=2_000_000_000, seconds=0.5)
    assert b.gb_per_s == pytest.approx(4.0)
    assert "4.0 GB/s" in str(b) and "500.00 ms" in str(b)


def test_best_seconds_takes_the_shortest_of_the_repeats():
    calls = []
    seconds = bandwidth.best_seconds(lambda: calls.append(1), repeats=4, warmup=2)
    assert len(calls) == 6 and 0 <= seconds < 0.1


def test_memory_bandwidth_counts_read_and_write():
    b = bandwidth.memory_bandwidth(nbytes=4 * 2**20, repeats=2)
    assert b.bytes == 2 * 4 * 2**20
    assert b.seconds > 0 and b.gb_per_s > 0


def test_lookup_bandwidth_counts_the_rows_read():
    b = bandwidth.lookup_bandwidth(num_embeddings=10_000, embedding_dim=16, batch_size=64, ids_per_bag=4, repeats=2)
    assert b.bytes == 64 * 4 * 16 * 4
    assert b.what == "fused EBC lookup" and b.gb_per_s > 0


def test_every_method_reads_the_fused_ebcs_own_table():
    import torch.nn.functional as F

    lookup = bandwidth.random_lookup(num_embeddings=5_000, embedding_dim=8, batch_size=16, ids_per_bag=3)
    assert lookup.table.data_ptr() == lookup.ebc._emb_modules[0]._emb_module.split_embedding_weights()[0].data_ptr()
    with torch.no_grad():
        fused = lookup.ebc(lookup.kjt).values()
        plain = F.embedding_bag(lookup.ids, lookup.table, lookup.offsets, mode="sum")
    assert torch.equal(fused, plain)
    assert lookup.read_bytes == 16 * 3 * 8 * 4


def test_compare_lookups_measures_every_method_per_thread_count_and_restores_the_threads():
    lookup = bandwidth.random_lookup(num_embeddings=5_000, embedding_dim=8, batch_size=16, ids_per_bag=3)
    before = torch.get_num_threads()
    rows = bandwidth.compare_lookups(lookup, threads=(1, 2), rounds=2, repeats=2, copy_bytes=2**20)
    assert torch.get_num_threads() == before
    assert [(r["threads"], r["method"]) for r in rows] == [
        (t, m) for t in (1, 2) for m in ("memory copy", *bandwidth.LOOKUP_METHODS)]
    limit = bandwidth.random_row_limit(rows)
    for row in rows:
        assert row["GB/s"] > 0 and row["ratio to random-row limit"] == pytest.approx(row["GB/s"] / limit[row["threads"]])
    plain = [r for r in rows if r["method"] in ("F.embedding_bag", "index_select")]
    assert max(r["ratio to random-row limit"] for r in plain if r["threads"] == 1) == pytest.approx(1.0)


def test_random_row_limit_is_the_best_plain_read_per_thread_count():
    rows = [{"threads": 1, "method": "memory copy", "GB/s": 30.0}, {"threads": 1, "method": "F.embedding_bag", "GB/s": 9.0},
            {"threads": 1, "method": "index_select", "GB/s": 5.0}, {"threads": 1, "method": "fused EBC", "GB/s": 20.0},
            {"threads": 2, "method": "index_select", "GB/s": 11.0}]
    assert bandwidth.random_row_limit(rows) == {1: 9.0, 2: 11.0}  # neither the copy nor the method under test


def test_unknown_method_is_refused():
    lookup = bandwidth.random_lookup(num_embeddings=100, embedding_dim=4, batch_size=2, ids_per_bag=2)
    with pytest.raises(ValueError, match="unknown lookup method"):
        bandwidth.lookup_bandwidth_of(lookup, "gather")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a fact about the CPU wheels (fbgemm-gpu-cpu)")
def test_imports_openmp_tells_torch_from_the_fbgemm_gpu_cpu_wheel():
    from pathlib import Path

    import fbgemm_gpu

    torch_cpu = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    tbe_common = Path(fbgemm_gpu.__file__).parent / "fbgemm_gpu_tbe_common.so"
    assert bandwidth.imports_openmp(torch_cpu)  # ATen's parallel_for runs on torch's threads
    assert not bandwidth.imports_openmp(tbe_common)  # the CPU TBE forward's parallel_for is a plain loop


def test_time_shares_add_up_and_name_the_fused_kernel(capfd):
    lookup = bandwidth.random_lookup(num_embeddings=5_000, embedding_dim=8, batch_size=16, ids_per_bag=3)
    shares = bandwidth.time_shares(lambda: lookup.ebc(lookup.kjt), calls=2)
    assert sum(shares.values()) == pytest.approx(1.0)
    assert "fbgemm::split_embedding_codegen_forward_cpu" in shares
    assert list(shares.values()) == sorted(shares.values(), reverse=True)
    assert "profiler_start" not in capfd.readouterr().err


def test_the_benchmark_prints_every_method_and_its_ratio_to_the_random_row_limit():
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run(
        [sys.executable, os.path.join(root, "benchmarks", "lookup_bandwidth.py"), "--rows", "20000", "--dim", "16",
         "--batch-size", "64", "--ids-per-bag", "4", "--threads", "1", "--rounds", "1", "--repeats", "2"],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout
    for method in ("memory copy", "F.embedding_bag", "index_select", "fused EBC"):
        assert method in out
    assert "x random-row limit" in out and "random-row limit with 1 thread(s)" in out
