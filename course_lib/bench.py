"""Time one training step of the embedding layer: a fused, table-batched EBC against a list of nn.EmbeddingBag.

The contestants see the same tables (same initial weights), the same batch and the same learning rate, and
each timed step does the same math: forward, backward of the summed output, and an SGD update of the rows the
batch touched.

- ``"fused EBC"``: ``torchrec.modules.fused_embedding_modules.FusedEmbeddingBagCollection``, backed by fbgemm's
  table-batched embedding kernel (TBE), the kernel DistributedModelParallel puts behind a sharded EBC. All
  tables live in one buffer; one forward call and one backward call (with the SGD update fused into it) serve
  all tables.
- ``"list of nn.EmbeddingBag"``: one ``nn.EmbeddingBag(sparse=True)`` per table in a Python loop, then
  ``torch.optim.SGD`` on their sparse gradients: what a model without TorchRec does.
- ``"EmbeddingBagCollection"`` (optional): torchrec's unsharded EBC, which is a ``ModuleDict`` of
  ``nn.EmbeddingBag`` looped over in Python, with dense gradients and ``torch.optim.SGD``.

Times are medians over interleaved rounds (each round runs every contestant once), so a noisy neighbour on the
machine slows all contestants alike instead of one.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor

FUSED = "fused EBC"
BAGS = "list of nn.EmbeddingBag"
EBC = "EmbeddingBagCollection"


@dataclass(frozen=True)
class LookupTiming:
    """Measured seconds per training step of each contestant, and how far their weights ended apart."""

    num_tables: int
    num_embeddings: int
    embedding_dim: int
    batch_size: int
    ids_per_bag: float
    seconds: dict[str, list[float]] = field(repr=False)
    max_weight_diff: float  # largest |fused - list| over all weights after the timed steps

    def median(self, name: str) -> float:
        """Median seconds per step of contestant `name`."""
        return statistics.median(self.seconds[name])

    @property
    def speedup(self) -> float:
        """How many times faster the fused EBC's step is than the list's (below 1: slower)."""
        return self.median(BAGS) / self.median(FUSED)

    def __str__(self) -> str:
        lines = [
            f"{self.num_tables} tables x {self.num_embeddings:,} rows x dim {self.embedding_dim}, "
            f"batch {self.batch_size}, {self.ids_per_bag:.1f} ids per bag on average"
        ]
        for name, times in self.seconds.items():
            lines.append(f"  {name:25} {statistics.median(times) * 1e3:8.2f} ms per step (median of {len(times)})")
        if self.speedup >= 1:
            lines.append(f"  fused EBC is {self.speedup:.1f}x as fast as the list of nn.EmbeddingBag")
        else:
            lines.append(f"  fused EBC is slower here: {1 / self.speedup:.1f}x the list of nn.EmbeddingBag's time")
        return "\n".join(lines)


def make_tables(num_tables: int, num_embeddings: int, embedding_dim: int) -> list[EmbeddingBagConfig]:
    """`num_tables` equal tables ``t0, t1, ...`` with one feature each (``f0, f1, ...``)."""
    return [
        EmbeddingBagConfig(
            name=f"t{i}", embedding_dim=embedding_dim, num_embeddings=num_embeddings, feature_names=[f"f{i}"]
        )
        for i in range(num_tables)
    ]


def random_batch(
    tables: list[EmbeddingBagConfig], batch_size: int, ids_per_bag: int, generator: torch.Generator
) -> KeyedJaggedTensor:
    """A KJT with one bag per sample and feature, bag lengths uniform in [0, 2 * ids_per_bag]."""
    keys = [name for table in tables for name in table.feature_names]
    lengths = torch.randint(0, 2 * ids_per_bag + 1, (len(keys) * batch_size,), generator=generator)
    per_key = lengths.view(len(keys), batch_size).sum(dim=1).tolist()
    rows = [table.num_embeddings for table in tables for _ in table.feature_names]
    values = torch.cat([torch.randint(0, n, (count,), generator=generator) for n, count in zip(rows, per_key)])
    return KeyedJaggedTensor(keys=keys, values=values, lengths=lengths)


def time_fused_vs_bags(
    num_tables: int = 26,
    num_embeddings: int = 10_000,
    embedding_dim: int = 32,
    batch_size: int = 512,
    ids_per_bag: int = 4,
    steps: int = 15,
    warmup: int = 3,
    include_ebc: bool = False,
    lr: float = 0.01,
    seed: int = 0,
) -> LookupTiming:
    """Time one embedding training step (forward, backward, SGD) of a fused EBC and of a list of
    nn.EmbeddingBag with the same tables and batch; ``include_ebc`` adds torchrec's unsharded EBC.

    Returns the measured times (seconds) and the largest weight difference between the fused EBC and the
    list after all steps, which shows that both did the same math.
    """
    from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection

    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    tables = make_tables(num_tables, num_embeddings, embedding_dim)
    kjt = random_batch(tables, batch_size, ids_per_bag, generator)
    cpu = torch.device("cpu")

    fused = FusedEmbeddingBagCollection(
        tables=tables, optimizer_type=torch.optim.SGD, optimizer_kwargs={"lr": lr}, device=cpu
    )
    bags = nn.ModuleList(
        nn.EmbeddingBag(num_embeddings, embedding_dim, mode="sum", sparse=True, device=cpu) for _ in tables
    )
    with torch.no_grad():
        for table, bag in zip(tables, bags):
            bag.weight.copy_(fused.embedding_bags[table.name].weight)
    bag_optimizer = torch.optim.SGD(bags.parameters(), lr=lr)
    features = kjt.to_dict()
    bag_inputs = [(features[t.feature_names[0]].values(), features[t.feature_names[0]].offsets()) for t in tables]

    def step_fused() -> None:
        fused(kjt).values().sum().backward()  # the SGD update runs inside backward

    def step_bags() -> None:
        pooled = [bag(ids, offsets[:-1]) for bag, (ids, offsets) in zip(bags, bag_inputs)]
        torch.cat(pooled, dim=1).sum().backward()
        bag_optimizer.step()
        bag_optimizer.zero_grad(set_to_none=True)

    contestants: dict[str, Callable[[], None]] = {FUSED: step_fused, BAGS: step_bags}
    if include_ebc:
        ebc = EmbeddingBagCollection(tables=tables, device=cpu)
        ebc_optimizer = torch.optim.SGD(ebc.parameters(), lr=lr)

        def step_ebc() -> None:
            ebc(kjt).values().sum().backward()
            ebc_optimizer.step()
            ebc_optimizer.zero_grad(set_to_none=True)

        contestants[EBC] = step_ebc

    seconds = _interleaved_medians(contestants, steps=steps, warmup=warmup)
    with torch.no_grad():
        diff = max(
            (fused.embedding_bags[table.name].weight - bag.weight).abs().max().item()
            for table, bag in zip(tables, bags)
        )
    return LookupTiming(
        num_tables=num_tables,
        num_embeddings=num_embeddings,
        embedding_dim=embedding_dim,
        batch_size=batch_size,
        ids_per_bag=kjt.lengths().float().mean().item(),
        seconds=seconds,
        max_weight_diff=diff,
    )


def _interleaved_medians(
    contestants: dict[str, Callable[[], None]], steps: int, warmup: int
) -> dict[str, list[float]]:
    """Run every contestant `warmup` times, then `steps` rounds of one timed call each."""
    for _ in range(warmup):
        for run in contestants.values():
            run()
    seconds: dict[str, list[float]] = {name: [] for name in contestants}
    for _ in range(steps):
        for name, run in contestants.items():
            start = time.perf_counter()
            run()
            seconds[name].append(time.perf_counter() - start)
    return seconds
