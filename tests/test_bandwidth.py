"""course_lib.bandwidth measures what it says: bytes moved per repetition, and a positive best time."""
from __future__ import annotations

import pytest

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
