"""The physical limit of an embedding lookup, measured: a streaming copy, and three ways to read the same random rows.

    lookup = bandwidth.random_lookup()                 # one table (2 M x 64 fp32), 4,096 bags x 32 random ids
    rows = bandwidth.compare_lookups(lookup, threads=(1, 2))
    for row in rows: print(row)                        # GB/s per method and thread count, and the ratio to the limit

An embedding lookup does almost no arithmetic: it reads rows from a table and, pooled, adds them up. On a
table much larger than the CPU's caches every row comes from main memory, so memory is the ceiling; but not
the *streaming* bandwidth a large copy reaches. A copy walks memory in order and the hardware prefetchers run
ahead of it; a lookup reads a few cache lines at unpredictable addresses, and each row costs a memory latency.
The ceiling of a lookup over random rows is a **random-row read**: the fastest way this machine reads the same
rows. ``compare_lookups`` measures, on one table and one batch of ids:

- ``memory copy``: a 256 MiB tensor copied into another (bytes read + written), the streaming bandwidth;
- ``F.embedding_bag``: torch's pooled lookup (``mode="sum"``): reads each row once and adds it into its bag;
- ``index_select``: reads each row and writes it out into a (reused) ``[ids, dim]`` buffer, twice the traffic;
- ``fused EBC``: torchrec's ``FusedEmbeddingBagCollection`` (fbgemm's table-batched kernel, TBE), the kernel
  the course's sharded tables run.

The three lookups read the same ``ids x dim x 4`` bytes of rows (the fused EBC's own table is the table of the
other two), and their GB/s count those bytes. The **random-row limit** for a thread count is the best of the
plain torch reads (``F.embedding_bag``, ``index_select``) at that count: ``ratio to random-row limit`` says how
close each method comes to it.

Every figure is the best repetition of several (after a warm-up), the usual way to read a peak; they vary from
run to run and with what else the machine is doing.
"""
from __future__ import annotations

import mmap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

__all__ = [
    "Bandwidth", "LOOKUP_METHODS", "RandomLookup", "best_seconds", "compare_lookups", "imports_openmp",
    "lookup_bandwidth", "lookup_bandwidth_of", "lookup_bytes", "memory_bandwidth", "random_lookup", "random_row_limit",
    "time_shares",
]

MiB = 2**20
LOOKUP_METHODS = ("F.embedding_bag", "index_select", "fused EBC")
_PLAIN_READS = ("F.embedding_bag", "index_select")  # the random-row reads plain torch offers


@dataclass(frozen=True)
class Bandwidth:
    """`bytes` moved by one repetition of an operation, and the best time of one repetition."""

    what: str
    bytes: int
    seconds: float

    @property
    def gb_per_s(self) -> float:
        """Decimal gigabytes per second (1 GB = 1e9 bytes), as bandwidths are quoted."""
        return self.bytes / self.seconds / 1e9

    def __str__(self) -> str:
        return f"{self.what}: {self.bytes / MiB:,.0f} MiB in {self.seconds * 1e3:.2f} ms = {self.gb_per_s:.1f} GB/s"


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def best_seconds(run: Callable[[], object], repeats: int = 5, warmup: int = 1, device: torch.device | None = None) -> float:
    """The shortest wall time of `repeats` calls of `run`, after `warmup` untimed calls (on a CUDA `device`, each
    call is timed to the end of its kernels)."""
    device = device or torch.device("cpu")
    for _ in range(warmup):
        run()
    _synchronize(device)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        _synchronize(device)
        best = min(best, time.perf_counter() - start)
    return best


def memory_bandwidth(nbytes: int = 256 * MiB, repeats: int = 5, device: torch.device | str = "cpu") -> Bandwidth:
    """Copy a `nbytes` float32 tensor into another: 2 x `nbytes` (read + written) per repetition.

    `nbytes` should be far larger than the last-level cache (tens of MiB), or the copy measures the cache.
    """
    device = torch.device(device)
    n = max(1, nbytes // 4)
    source = torch.ones(n, dtype=torch.float32, device=device)
    target = torch.empty_like(source)
    seconds = best_seconds(lambda: target.copy_(source), repeats=repeats, device=device)
    return Bandwidth("memory copy", 2 * n * 4, seconds)


def lookup_bytes(num_ids: int, embedding_dim: int, bytes_per_element: int = 4) -> int:
    """Bytes of embedding rows that a lookup of `num_ids` ids reads: one row of `embedding_dim` elements each."""
    return num_ids * embedding_dim * bytes_per_element


@dataclass(frozen=True)
class RandomLookup:
    """One table and one batch of uniformly random ids, for every method: the fused EBC (`ebc`, fed `kjt`) and
    its own table as a ``[rows, dim]`` tensor (`table`, fed `ids` and `offsets`) for the plain torch reads."""

    ebc: Any
    kjt: Any
    table: torch.Tensor
    ids: torch.Tensor
    offsets: torch.Tensor

    @property
    def read_bytes(self) -> int:
        """Bytes of rows one lookup of the batch reads (ids x dim x 4)."""
        return lookup_bytes(self.ids.numel(), self.table.shape[1], self.table.element_size())

    def describe(self) -> str:
        rows, dim = self.table.shape
        bags = self.offsets.numel()
        return (f"table {rows:,} x {dim} fp32 ({rows * dim * 4 / MiB:,.0f} MiB), {bags:,} bags x "
                f"{self.ids.numel() // bags} random ids ({self.read_bytes / MiB:,.0f} MiB of rows per lookup)")


def random_lookup(
    num_embeddings: int = 2_000_000,
    embedding_dim: int = 64,
    batch_size: int = 4096,
    ids_per_bag: int = 32,
    seed: int = 0,
    device: torch.device | str = "cpu",
) -> RandomLookup:
    """A fused EBC of one `num_embeddings` x `embedding_dim` float32 table (the default, 2 M x 64, is 488 MiB: far
    beyond any CPU cache) and `batch_size` bags of `ids_per_bag` uniformly random ids; `table` is the EBC's own
    weight tensor (fbgemm's), so every method reads the same memory."""
    from torchrec import EmbeddingBagConfig, KeyedJaggedTensor
    from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection

    device = torch.device(device)
    torch.manual_seed(seed)
    config = EmbeddingBagConfig(name="t", embedding_dim=embedding_dim, num_embeddings=num_embeddings, feature_names=["f"])
    ebc = FusedEmbeddingBagCollection(
        tables=[config], optimizer_type=torch.optim.SGD, optimizer_kwargs={"lr": 0.01}, device=device
    )
    table = ebc._emb_modules[0]._emb_module.split_embedding_weights()[0]  # a view of the TBE's weights
    generator = torch.Generator().manual_seed(seed)
    num_ids = batch_size * ids_per_bag
    ids = torch.randint(0, num_embeddings, (num_ids,), generator=generator).to(device)
    lengths = torch.full((batch_size,), ids_per_bag, device=device)
    kjt = KeyedJaggedTensor(keys=["f"], values=ids, lengths=lengths)
    offsets = torch.arange(0, num_ids, ids_per_bag, device=device)
    return RandomLookup(ebc=ebc, kjt=kjt, table=table, ids=ids, offsets=offsets)


def _method(lookup: RandomLookup, method: str) -> Callable[[], object]:
    import torch.nn.functional as F

    if method == "F.embedding_bag":
        return lambda: F.embedding_bag(lookup.ids, lookup.table, lookup.offsets, mode="sum")
    if method == "index_select":
        out = torch.empty(lookup.ids.numel(), lookup.table.shape[1], dtype=lookup.table.dtype, device=lookup.table.device)
        return lambda: torch.index_select(lookup.table, 0, lookup.ids, out=out)  # no fresh 32 MiB to fault in each call
    if method == "fused EBC":
        return lambda: lookup.ebc(lookup.kjt)
    raise ValueError(f"unknown lookup method {method!r}: one of {LOOKUP_METHODS}")


def lookup_bandwidth_of(lookup: RandomLookup, method: str, repeats: int = 9) -> Bandwidth:
    """`method` (one of LOOKUP_METHODS) over `lookup`'s ids, without autograd: rows read per second."""
    run = _method(lookup, method)
    with torch.no_grad():
        seconds = best_seconds(run, repeats=repeats, device=lookup.table.device)
    return Bandwidth(method, lookup.read_bytes, seconds)


def lookup_bandwidth(
    num_embeddings: int = 2_000_000,
    embedding_dim: int = 64,
    batch_size: int = 4096,
    ids_per_bag: int = 32,
    repeats: int = 5,
    seed: int = 0,
) -> Bandwidth:
    """Forward passes of a fused EBC (fbgemm's table-batched kernel) over uniformly random ids: rows read per
    second (``lookup_bytes(batch_size * ids_per_bag, embedding_dim)`` per repetition)."""
    lookup = random_lookup(num_embeddings, embedding_dim, batch_size, ids_per_bag, seed)
    result = lookup_bandwidth_of(lookup, "fused EBC", repeats=repeats)
    return Bandwidth("fused EBC lookup", result.bytes, result.seconds)


def random_row_limit(rows: Sequence[dict[str, Any]]) -> dict[int, float]:
    """Per thread count: the best GB/s of the plain torch random-row reads among `rows` (``compare_lookups``'s)."""
    limit: dict[int, float] = {}
    for row in rows:
        if row["method"] in _PLAIN_READS:
            limit[row["threads"]] = max(limit.get(row["threads"], 0.0), row["GB/s"])
    return limit


def compare_lookups(
    lookup: RandomLookup, threads: Sequence[int] = (1, 2), rounds: int = 5, repeats: int = 5,
    copy_bytes: int = 256 * MiB,
) -> list[dict[str, Any]]:
    """For each thread count (``torch.set_num_threads``; restored afterwards): the memory copy and every lookup
    method on `lookup`. One row per (threads, method): GB/s, and the ratio to the random-row limit of that
    thread count (``random_row_limit``); the copy's ratio says how far streaming is above it.

    The measurements are interleaved: `rounds` rounds, each timing every (threads, method) `repeats` times, and
    the best time of all rounds is kept; a method is not penalised for running while something else ran.
    """
    device = lookup.table.device
    n = max(1, copy_bytes // 4)
    source = torch.ones(n, dtype=torch.float32, device=device)
    target = torch.empty_like(source)
    runs = {"memory copy": (lambda: target.copy_(source), 2 * n * 4)}
    runs.update({method: (_method(lookup, method), lookup.read_bytes) for method in LOOKUP_METHODS})
    best: dict[tuple[int, str], float] = {}
    before = torch.get_num_threads()
    try:
        with torch.no_grad():
            for _ in range(rounds):
                for count in threads:
                    torch.set_num_threads(count)
                    for method, (run, _) in runs.items():
                        seconds = best_seconds(run, repeats=repeats, device=device)
                        best[count, method] = min(best.get((count, method), float("inf")), seconds)
    finally:
        torch.set_num_threads(before)
    rows = [{"threads": count, "method": method, "GB/s": runs[method][1] / best[count, method] / 1e9,
             "seconds": best[count, method]} for count in threads for method in runs]
    limit = random_row_limit(rows)
    for row in rows:
        row["ratio to random-row limit"] = row["GB/s"] / limit[row["threads"]]
    return rows


def time_shares(run: Callable[[], object], calls: int = 3) -> dict[str, float]:
    """Share of CPU time per operator (self time, ``torch.profiler``) over `calls` calls of `run`, largest first.

    The profiler's own start/stop lines, which its C++ side writes to the process's stderr, are dropped.
    """
    import os
    import sys

    from torch.profiler import profile

    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            with torch.no_grad(), profile() as prof:
                for _ in range(calls):
                    run()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    times = {event.key: float(event.self_cpu_time_total) for event in prof.key_averages()}
    total = sum(times.values()) or 1.0
    return dict(sorted(((k, v / total) for k, v in times.items()), key=lambda kv: -kv[1]))


def imports_openmp(library: str | Path) -> bool:
    """Whether the shared library at `library` imports the OpenMP runtime (``GOMP_parallel``, ``omp_get_num_threads``).

    ATen's ``at::parallel_for`` is inline code: a library compiled without OpenMP runs it as one plain loop on the
    calling thread, whatever ``torch.set_num_threads`` says. (A byte search of the file for the imported names:
    enough for the libraries of a wheel.)
    """
    with open(library, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        return any(data.find(name) >= 0 for name in (b"GOMP_parallel\x00", b"omp_get_num_threads\x00"))
