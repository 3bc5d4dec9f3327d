"""Checks for 09_scale: fit a production layout into HBM with a cache, lookup bandwidth, a multi-node torchrun command."""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

from course_lib.checks import exercise, fail, passed

LOAD_FACTORS = (0.1, 0.25, 0.5, 0.75, 0.9, 1.0)
HBM_GIB = 16
WORLD_SIZE, RANKS_PER_NODE = 64, 8


def production_tables() -> list[Any]:
    """The lab's production-size tables: 10 x 100M rows x 256, 5 x 10M x 128, 5 x 1M x 128 (263 B parameters)."""
    from torchrec import EmbeddingBagConfig

    sizes = [(100_000_000, 256)] * 10 + [(10_000_000, 128)] * 5 + [(1_000_000, 128)] * 5
    return [
        EmbeddingBagConfig(name=f"t{i:02d}", embedding_dim=dim, num_embeddings=rows, feature_names=[f"f{i:02d}"])
        for i, (rows, dim) in enumerate(sizes)
    ]


def caching_constraints(tables: Sequence[Any], load_factor: float) -> dict[str, Any]:
    """Every table on the UVM-caching kernel with the given cache load factor (the fraction of rows cached in HBM)."""
    from torchrec.distributed.embedding_types import EmbeddingComputeKernel
    from torchrec.distributed.planner import ParameterConstraints
    from torchrec.distributed.types import CacheParams

    return {
        t.name: ParameterConstraints(
            compute_kernels=[EmbeddingComputeKernel.FUSED_UVM_CACHING.value],
            cache_params=CacheParams(load_factor=load_factor),
        )
        for t in tables
    }


def plan_fits(load_factor: float, hbm_gib: float = HBM_GIB) -> bool:
    """Does the planner find a plan for the production tables, all UVM-cached at `load_factor`, on 64 GPUs of `hbm_gib`?"""
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.types import PlannerError

    from course_lib import planning

    tables = production_tables()
    topology = planning.topology(
        WORLD_SIZE, local_world_size=RANKS_PER_NODE, compute_device="cuda", hbm_cap_bytes=int(hbm_gib * 2**30)
    )
    planner = EmbeddingShardingPlanner(topology=topology, constraints=caching_constraints(tables, load_factor))
    try:
        planner.plan(planning.meta_ebc(tables), [EmbeddingBagCollectionSharder()])
    except PlannerError:
        return False
    return True


@exercise
def check_load_factor(load_factor: float) -> None:
    """`load_factor` must be the largest of LOAD_FACTORS for which the cached plan fits 64 GPUs of 16 GiB."""
    if load_factor not in LOAD_FACTORS:
        fail(f"{load_factor!r} is not one of the load factors on the menu {LOAD_FACTORS}")
    if not plan_fits(load_factor):
        fail(
            f"with load factor {load_factor} the planner finds no plan on {WORLD_SIZE} GPUs of {HBM_GIB} GiB",
            "the cache lives in HBM: a load factor of 1.0 caches every row, which is the whole table in HBM again",
        )
    bigger = [f for f in LOAD_FACTORS if f > load_factor]
    if bigger and plan_fits(bigger[0]):
        fail(
            f"load factor {load_factor} fits, but so does {bigger[0]}",
            "pick the largest that fits: a bigger cache keeps more hot rows in HBM, so fewer lookups miss to host memory",
        )
    passed(f"load factor {load_factor}: the largest cache that fits {WORLD_SIZE} GPUs of {HBM_GIB} GiB")


_LOOKUP_CASES = (
    # (num_ids, embedding_dim, seconds, bytes_per_element)
    (131_072, 64, 0.005, 4),
    (4096 * 20, 128, 0.0021, 2),
    (1_000_000, 32, 0.3, 4),
)


@exercise
def check_lookup_bandwidth(lookup_gb_per_s: Callable[..., float]) -> None:
    """`lookup_gb_per_s(num_ids, embedding_dim, seconds, bytes_per_element)`: GB/s of embedding rows read."""
    for num_ids, dim, seconds, element in _LOOKUP_CASES:
        expected = num_ids * dim * element / seconds / 1e9
        got = lookup_gb_per_s(num_ids, dim, seconds, element)
        if not isinstance(got, (int, float)):
            fail(f"lookup_gb_per_s returned {got!r}", "return a number: gigabytes (1e9 bytes) per second")
        if math.isclose(got, expected, rel_tol=1e-6):
            continue
        ratio = got / expected if expected else float("inf")
        hints = {
            1 / element: "each id reads a row of embedding_dim elements of bytes_per_element bytes each",
            2.0: "a lookup reads the rows; nothing is written back to the table in a forward pass",
            1e3: "seconds are seconds: 1 GB/s is 1e9 bytes per second",
            1e-3: "seconds are seconds: 1 GB/s is 1e9 bytes per second",
            1.073741824: "GB here is decimal (1e9 bytes), as bandwidths are quoted, not GiB",
            1 / 1.073741824: "GB here is decimal (1e9 bytes), as bandwidths are quoted, not GiB",
        }
        hint = next((h for r, h in hints.items() if math.isclose(ratio, r, rel_tol=1e-3)),
                    "bytes read = ids x embedding_dim x bytes_per_element; divide by the seconds and by 1e9")
        fail(f"for {num_ids:,} ids of dim {dim} ({element} bytes each) in {seconds} s: got {got:.4g}, expected {expected:.4g} GB/s", hint)
    passed("lookup bandwidth = ids x dim x bytes per element / seconds, in GB/s")


@exercise
def check_torchrun_command(torchrun_command: Callable[..., Sequence[str]]) -> None:
    """`torchrun_command(nnodes, nproc_per_node, node_rank, head, port)`: the argv that starts the capstone on one node."""
    from torch.distributed.run import get_args_parser

    for nnodes, nproc, node_rank, head, port in ((2, 1, 1, "127.0.0.1", 29400), (8, 8, 5, "node-a17", 29500)):
        argv = list(torchrun_command(nnodes, nproc, node_rank, head, port))
        if not argv or not all(isinstance(a, str) for a in argv):
            fail(f"expected a list of strings, got {argv!r}", "e.g. ['torchrun', '--nnodes', '2', ...]: one string per argument")
        if argv[0] != "torchrun":
            fail(f"the command starts with {argv[0]!r}", "start it with 'torchrun'")
        try:
            args = get_args_parser().parse_args(argv[1:])
        except SystemExit:
            fail(f"torchrun rejects these arguments: {' '.join(argv[1:])}", "write flags as torchrun spells them: --nnodes 2")
        where = f"node {node_rank} of {nnodes} with {nproc} GPUs each"
        if str(args.nnodes) != str(nnodes):
            fail(f"{where}: --nnodes is {args.nnodes}", "--nnodes is the number of machines")
        if str(args.nproc_per_node) != str(nproc):
            fail(
                f"{where}: --nproc-per-node is {args.nproc_per_node}",
                "torchrun starts that many processes on THIS node: one per local GPU, not the world size",
            )
        if args.node_rank != node_rank:
            fail(f"{where}: --node-rank is {args.node_rank}", "every node needs its own rank, 0 to nnodes - 1; without it all say 0")
        if (args.master_addr, args.master_port) != (head, port):
            fail(f"{where}: rendezvous at {args.master_addr}:{args.master_port}", f"every node meets at the head node: --master-addr {head} --master-port {port}")
        if not args.module or args.training_script != "course_lib.run":
            fail(f"{where}: torchrun would run {args.training_script!r} as a {'module' if args.module else 'script file'}",
                 "run the course's runner as a module: -m course_lib.run course_lib.capstone:train")
        if list(args.training_script_args[:1]) != ["course_lib.capstone:train"]:
            fail(f"{where}: course_lib.run gets {args.training_script_args}", "its first argument is the function: course_lib.capstone:train")
    passed("torchrun accepts the command, and every node gets its own --node-rank and the same rendezvous")
