"""The physical limit of an embedding lookup: this machine's memory bandwidth against a fused EBC's lookup bandwidth.

    copy = bandwidth.memory_bandwidth()          # a large tensor copy: bytes read + written per second
    lookup = bandwidth.lookup_bandwidth()        # a fused EBC forward over random ids: row bytes read per second
    print(copy, lookup, f"{lookup.gb_per_s / copy.gb_per_s:.0%}", sep="\\n")

An embedding lookup does almost no arithmetic: it reads rows from a table (and, pooled, adds them up). On a
table much larger than the CPU's caches, every row read comes from main memory, so the memory bandwidth is
the ceiling of the lookup bandwidth. Random rows reach less of it than a streaming copy does: each row is a
few cache lines at an unpredictable address, and the prefetchers cannot run ahead.

Both figures are the best repetition of several (after a warm-up), the usual way to read a peak; they vary
from run to run and with what else the machine is doing. ``bytes`` counts only what the operation must
move: a copy reads and writes every byte once; a lookup reads ``ids x embedding_dim x bytes per element``
(the ids, offsets and pooled output are a few percent more, not counted).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch

__all__ = ["Bandwidth", "best_seconds", "lookup_bandwidth", "lookup_bytes", "memory_bandwidth"]

MiB = 2**20


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


def best_seconds(run: Callable[[], object], repeats: int = 5, warmup: int = 1) -> float:
    """The shortest wall time of `repeats` calls of `run`, after `warmup` untimed calls."""
    for _ in range(warmup):
        run()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def memory_bandwidth(nbytes: int = 256 * MiB, repeats: int = 5) -> Bandwidth:
    """Copy a `nbytes` float32 tensor into another: 2 x `nbytes` (read + written) per repetition.

    `nbytes` should be far larger than the last-level cache (tens of MiB), or the copy measures the cache.
    """
    n = max(1, nbytes // 4)
    source = torch.ones(n, dtype=torch.float32)
    target = torch.empty_like(source)
    seconds = best_seconds(lambda: target.copy_(source), repeats=repeats)
    return Bandwidth("memory copy", 2 * n * 4, seconds)


def lookup_bytes(num_ids: int, embedding_dim: int, bytes_per_element: int = 4) -> int:
    """Bytes of embedding rows that a lookup of `num_ids` ids reads: one row of `embedding_dim` elements each."""
    return num_ids * embedding_dim * bytes_per_element


def lookup_bandwidth(
    num_embeddings: int = 2_000_000,
    embedding_dim: int = 64,
    batch_size: int = 4096,
    ids_per_bag: int = 32,
    repeats: int = 5,
    seed: int = 0,
) -> Bandwidth:
    """Forward passes of a fused EBC (fbgemm's table-batched kernel) over uniformly random ids.

    One table of `num_embeddings` x `embedding_dim` float32 (the default, 2M x 64, is 488 MiB: far beyond
    any CPU cache), `batch_size` bags of `ids_per_bag` ids each, summed. Bytes per repetition:
    ``lookup_bytes(batch_size * ids_per_bag, embedding_dim)``.
    """
    from torchrec import EmbeddingBagConfig, KeyedJaggedTensor
    from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection

    torch.manual_seed(seed)
    table = EmbeddingBagConfig(name="t", embedding_dim=embedding_dim, num_embeddings=num_embeddings, feature_names=["f"])
    ebc = FusedEmbeddingBagCollection(
        tables=[table], optimizer_type=torch.optim.SGD, optimizer_kwargs={"lr": 0.01}, device=torch.device("cpu")
    )
    generator = torch.Generator().manual_seed(seed)
    num_ids = batch_size * ids_per_bag
    ids = torch.randint(0, num_embeddings, (num_ids,), generator=generator)
    kjt = KeyedJaggedTensor(keys=["f"], values=ids, lengths=torch.full((batch_size,), ids_per_bag))
    with torch.no_grad():
        seconds = best_seconds(lambda: ebc(kjt), repeats=repeats)
    return Bandwidth("fused EBC lookup", lookup_bytes(num_ids, embedding_dim), seconds)
