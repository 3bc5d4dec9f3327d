"""Checks for 09_scale: fit a production layout into HBM with a cache, a plan under a memory and a communication budget,
lookup bandwidth, a multi-node torchrun command."""
from __future__ import annotations

import functools
import math
from typing import Any, Callable, Sequence

from course_lib.checks import CheckFailed, checked_call, exercise, fail, is_number, one_line, passed, raise_if_unwritten

# Caching kernels take a load factor strictly between 0 and 1: torchrec refuses 1.0 whatever the memory (a cache of
# every row is no cache; every row in HBM is the fused kernel), in validate_compute_kernels
# (torchrec/distributed/planner/planners.py), so 1.0 is not on the menu.
LOAD_FACTORS = (0.1, 0.25, 0.5, 0.75, 0.9)
HBM_GIB = 16
FRESH_HBM_GIB = 20  # a second cluster, whose answer (0.9) the lab does not show
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


@functools.lru_cache(maxsize=None)  # a plan takes seconds, and a rerun check asks the same questions
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


def largest_fitting(hbm_gib: float) -> float | None:
    """The largest of LOAD_FACTORS whose cached plan fits 64 GPUs of `hbm_gib` (searched from the top), or None."""
    return next((f for f in sorted(LOAD_FACTORS, reverse=True) if plan_fits(f, hbm_gib)), None)


@exercise
def check_load_factor(search: Callable[[float], Any]) -> None:
    """`search(hbm_gib)` (the lab's ``largest_fitting_load_factor``) must return the largest of LOAD_FACTORS for which
    the cached plan fits 64 GPUs of `hbm_gib`. The check calls it for HBM_GIB, the lab's 16 GiB, and for
    FRESH_HBM_GIB, whose answer the lab does not show: a load factor typed in, or a search that plans 16 GiB whatever
    it is asked, gives the 16 GiB answer there too (a few plans, a few seconds)."""
    if not callable(search):
        fail(f"expected the function that searches the menu, got {search!r}",
             "pass the function itself: lab09.check_load_factor(largest_fitting_load_factor); the check calls it")
    answers = {}
    for hbm_gib in (HBM_GIB, FRESH_HBM_GIB):
        try:
            answers[hbm_gib] = checked_call("largest_fitting_load_factor", search, hbm_gib)
        except CheckFailed:
            raise
        except Exception as error:
            raise_if_unwritten(error)
            fail(f"your search raised {one_line(error)} for {WORLD_SIZE} GPUs of {hbm_gib} GiB",
                 "give it the HBM per GPU as its argument and plan that: plan_cluster(hbm_gib, ...)")
    load_factor = answers[HBM_GIB]
    if load_factor not in LOAD_FACTORS:
        fail(f"for {WORLD_SIZE} GPUs of {HBM_GIB} GiB your search gives {load_factor!r}, which is not one of the load "
             f"factors on the menu {LOAD_FACTORS}", "return the factor of the menu whose plan fits, a number")
    if not plan_fits(load_factor):
        fail(
            f"for {WORLD_SIZE} GPUs of {HBM_GIB} GiB your search gives {load_factor}, and with it the planner finds no plan",
            "the cache lives in HBM: a larger load factor keeps more of every table there; try each factor with the "
            "planner and keep the largest whose plan it finds",
        )
    bigger = [f for f in LOAD_FACTORS if f > load_factor]
    if bigger and plan_fits(bigger[0]):
        fail(
            f"for {WORLD_SIZE} GPUs of {HBM_GIB} GiB your search gives {load_factor}, which fits, but so does {bigger[0]}",
            "pick the largest that fits: a bigger cache keeps more hot rows in HBM, so fewer lookups miss to host memory",
        )
    got, want = answers[FRESH_HBM_GIB], largest_fitting(FRESH_HBM_GIB)
    if got != want:
        fail(f"for {WORLD_SIZE} GPUs of {FRESH_HBM_GIB} GiB your search gives {got!r}, but the largest cache that fits "
             f"there is {want}" + (f": the same answer as for {HBM_GIB} GiB, as if typed in or planned for "
                                   f"{HBM_GIB} GiB whatever hbm_gib says" if got == load_factor else ""),
             "search the menu with the planner at the HBM you are given: plan_cluster(hbm_gib, "
             "lab09.caching_constraints(TABLES, factor)) for each factor, from the largest down")
    passed(f"load factor {load_factor}: the largest cache that fits {WORLD_SIZE} GPUs of {HBM_GIB} GiB "
           f"(and your search finds {want} for {FRESH_HBM_GIB} GiB)")


# ------------------------------------------------------------------------ a plan under two budgets

PLAN_HBM_CAP_GIB = 80  # the H100s of the lab's cluster
HBM_BUDGET_GIB = 20.0  # per rank: the rest of the 80 GiB stays for the dense part, activations, NCCL buffers
COMMS_BUDGET_MS = 5.0  # the busiest rank's estimated communication per step (forward + backward)
# ... and the busiest rank's embedding step in all (the planner's Perf.total: lookups, cache misses and prefetch
# from host memory, communication): memory must not be bought with time the comms estimate does not show
STEP_BUDGET_MS = 8.0


def plan_estimates(constraints: dict[str, Any] | None, hbm_cap_gib: float = PLAN_HBM_CAP_GIB) -> dict[str, Any]:
    """Plan the production tables on 64 GPUs (8 nodes of 8, `hbm_cap_gib` each) with `constraints`, and read the
    planner's own estimates of the plan it chose: HBM per rank (GiB; its storage estimate: weights, a cached
    kernel's cache and its bookkeeping, input/output buffers) and communication per rank (ms per step, forward +
    backward) and the embedding step per rank (ms, the planner's ``Perf.total``: lookup compute, cache misses and
    prefetch from host memory, and that communication), the largest of each, and each table's sharding type and
    kernel. Raises the planner's
    ``PlannerError`` when it finds no plan.

    The HBM estimate holds no optimizer state: the planner adds it only for an optimizer recorded on the
    parameter (``_optimizer_classes``, set by ``apply_optimizer_in_backward``; ``calculate_shard_storages`` and
    ``_get_optimizer_multipler`` in ``torchrec/distributed/planner/shard_estimators.py``, whose multiplier is 0
    without one), and these meta tables have none, as with the sharder's ``fused_params``. So HBM_BUDGET_GIB
    budgets the tables without their optimizer state."""
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner

    from course_lib import planning

    tables = production_tables()
    topology = planning.topology(WORLD_SIZE, local_world_size=RANKS_PER_NODE, compute_device="cuda",
                                 hbm_cap_bytes=int(hbm_cap_gib * 2**30))
    estimates = planning.Estimates()
    planner = EmbeddingShardingPlanner(topology=topology, constraints=constraints or None, callbacks=[estimates])
    planner.plan(planning.meta_ebc(tables), [EmbeddingBagCollectionSharder()])
    hbm, comms = estimates.per_rank(WORLD_SIZE)
    step = [0.0] * WORLD_SIZE
    for option in estimates.options:
        for shard in option.shards:
            step[shard.rank] += shard.perf.total
    return {
        "max HBM GiB": max(hbm), "max comms ms": max(comms), "max step ms": max(step),
        "HBM GiB per rank": hbm, "comms ms per rank": comms, "step ms per rank": step,
        "tables": {option.name: (option.sharding_type, option.compute_kernel) for option in estimates.options},
    }


# ParameterConstraints fields that describe the workload to the planner's estimators, not a choice of plan
_WORKLOAD_FIELDS = ("pooling_factors", "num_poolings", "batch_sizes", "is_weighted")
# CacheParams fields that describe the training pipeline or the ids to the estimators, not the cache: with
# prefetch_pipeline the planner prices every cached lookup at HBM bandwidth whatever the load factor
# (kernel_bw_lookup in torchrec/distributed/planner/constants.py); stats carries the ids' cache hit rate
_PIPELINE_CACHE_FIELDS = {
    "prefetch_pipeline": "describes the training pipeline (a prefetching TrainPipelinePrefetch, which the course "
                         "does not run), not the plan: with it the planner prices every cached lookup at HBM speed "
                         "whatever the load factor, so a cache of 1% of the rows looks as fast as all rows in HBM",
    "stats": "describes the ids (their cache hit rate), not the plan: the planner then estimates the misses from "
             "figures you typed in, not from the load factor",
    "multipass_prefetch_config": "describes how a prefetching training pipeline (which the course does not run) "
                                 "splits its prefetch, not the plan: the planner sizes that pipeline's buffers by it",
}
# the kernels that serve plain tables (EmbeddingBagConfig, use_virtual_table=False) in HBM, host memory or a cache;
# dense is data_parallel's. key_value and the *_virtual_table kernels are for key-value (virtual) tables
_PLAIN_KERNELS = ("fused", "fused_uvm", "fused_uvm_caching", "dense")


def _not_a_plain_kernel(kernel: str) -> str:
    """Why `kernel` (not in _PLAIN_KERNELS) is no layout for the production tables."""
    if not isinstance(kernel, str):
        return (f"{kernel!r} is not a kernel's name, and the planner matches names: compute_kernels takes strings "
                "such as EmbeddingComputeKernel.FUSED.value ('fused')")
    if kernel != "key_value" and not kernel.endswith("_virtual_table"):
        return (f"{kernel} is no kernel the EmbeddingBagCollectionSharder offers for these tables, so the planner "
                "has nothing to place them with")
    where = "on SSD" if kernel in ("key_value", "ssd_virtual_table") else \
        "in host DRAM and on SSD" if kernel == "dram_ssd_virtual_table" else "in host memory"
    priced = (", and the planner prices its lookups at the full host-to-GPU bandwidth, 10 times fused_uvm's, so rows "
              "kept off the GPU look cheap" if kernel.endswith("_virtual_table") else "")
    return (f"{kernel} is a kernel for virtual (key-value) tables, with rows {where}: these are plain tables "
            f"(EmbeddingBagConfig, use_virtual_table=False), which DMP cannot shard with it{priced}")


@exercise
def check_budget_plan(choose_constraints: Callable[[], Any]) -> None:
    """`choose_constraints()` must return constraints (table name -> ``ParameterConstraints``, for some or all of the
    production tables) that make
    the planner's plan on 64 x 80 GiB meet both budgets, by the planner's own estimates: at most
    HBM_BUDGET_GIB of HBM on every rank, at most COMMS_BUDGET_MS of communication on the busiest rank; and it may not
    buy the memory with time the communication estimate leaves out (rows read from host memory): at most
    STEP_BUDGET_MS for the busiest rank's embedding step in all. The constraints may not describe the workload
    (_WORKLOAD_FIELDS) or the training pipeline (_PIPELINE_CACHE_FIELDS) to the estimators, nor take the plain
    tables for virtual ones (use_virtual_table, key_value_params), and every table must be on a kernel for plain
    tables (_PLAIN_KERNELS), whether the constraints or the planner chose it."""
    from torchrec.distributed.planner import ParameterConstraints
    from torchrec.distributed.planner.types import PlannerError

    if not callable(choose_constraints):
        fail(f"expected the function that chooses the constraints, got a {type(choose_constraints).__name__}",
             "pass the function itself: lab09.check_budget_plan(choose_constraints); the check calls it")
    try:
        constraints = checked_call("choose_constraints", choose_constraints)
    except CheckFailed:
        raise
    except Exception as error:
        raise_if_unwritten(error)
        fail(f"choose_constraints() raised {one_line(error)}", "return the constraints you give the planner")
    if not isinstance(constraints, dict):
        fail(f"expected a dict of table name -> ParameterConstraints, got {type(constraints).__name__}",
             "return the constraints you give the planner (plan_cluster(80, constraints)), not a plan or a list")
    names = {t.name for t in production_tables()}
    unknown = sorted(set(constraints) - names)
    if unknown:
        fail(f"{', '.join(map(str, unknown[:3]))} {'is' if len(unknown) == 1 else 'are'} not a table of the model",
             "constraints are keyed by table name: t00 ... t19 (lab09.production_tables())")
    wrong = sorted(k for k, v in constraints.items() if not isinstance(v, ParameterConstraints))
    if wrong:
        fail(f"the constraint of {wrong[0]} is a {type(constraints[wrong[0]]).__name__}",
             "each value is a torchrec ParameterConstraints(sharding_types=[...], compute_kernels=[...], ...)")
    default = ParameterConstraints()
    for name, constraint in sorted(constraints.items()):
        for field in _WORKLOAD_FIELDS:
            if getattr(constraint, field) != getattr(default, field):
                fail(f"the constraint of {name} sets {field}={getattr(constraint, field)!r}: that describes the data "
                     "(ids per bag, bags per step, weights), not the plan",
                     "the planner then estimates a lighter workload than the model's; leave the workload at its "
                     "defaults and choose sharding types, kernels and cache load factors")
        cache = constraint.cache_params
        for field, why in _PIPELINE_CACHE_FIELDS.items():
            value = getattr(cache, field, None)
            if value is not None and value is not False:
                fail(f"the constraint of {name} sets cache_params.{field}={value!r}: that {why}",
                     "leave it unset: a cache is chosen by its load factor (CacheParams(load_factor=...)), and the "
                     "step budget counts the lookups that miss it")
        if constraint.use_virtual_table or constraint.key_value_params is not None:
            said = ("use_virtual_table=True" if constraint.use_virtual_table
                    else f"key_value_params={constraint.key_value_params!r}")
            priced = (": the planner then sizes every row of the table at 0 bytes of HBM (calculate_shard_storages), "
                      "whichever kernel keeps them" if constraint.use_virtual_table else "")
            fail(f"the constraint of {name} sets {said}: that describes a virtual (key-value) table, whose rows live "
                 f"off the GPU, and these are plain tables (EmbeddingBagConfig, use_virtual_table=False){priced}",
                 "leave use_virtual_table and key_value_params unset: choose sharding types, kernels (fused, fused_uvm, "
                 "fused_uvm_caching) and cache load factors")
        load_factor = getattr(cache, "load_factor", None)
        caching = not constraint.compute_kernels or "fused_uvm_caching" in constraint.compute_kernels
        if caching and load_factor is not None and not 0 < load_factor < 1:
            fail(f"the constraint of {name} asks for a cache load factor of {load_factor!r}: torchrec refuses a "
                 "caching kernel whose load factor is not strictly between 0 and 1, whatever the memory "
                 "(validate_compute_kernels, after the plan is made)",
                 "a cache of every row is the fused kernel (every row in HBM); a cache of none is fused_uvm (every "
                 "row in host memory): name that kernel, or a load factor between 0 and 1")
        foreign = [k for k in (constraint.compute_kernels or ()) if k not in _PLAIN_KERNELS]
        if foreign:
            fail(f"the constraint of {name} allows the {foreign[0]} kernel: {_not_a_plain_kernel(foreign[0])}",
                 "choose among fused (every row in HBM), fused_uvm (every row in host memory) and fused_uvm_caching "
                 "(a cache in HBM of a load factor of the rows)")
    try:
        found = plan_estimates(constraints)
    except PlannerError:
        fail(f"the planner finds no plan on {WORLD_SIZE} GPUs of {PLAN_HBM_CAP_GIB} GiB with these constraints",
             "a 100 M x 256 table is 95 GiB in fp32: it must be cut (row-, column-, table-row-wise, grid) or cached")
    left_out = sorted(names - set(found["tables"]))
    if left_out:
        fail(f"the planner's plan places {len(names) - len(left_out)} of {len(names)} tables: "
             f"{', '.join(left_out[:3])}{' ...' if len(left_out) > 3 else ''} {'is' if len(left_out) == 1 else 'are'} "
             "on no rank, so its bytes and traffic are in no estimate",
             "a constraint that this cluster cannot meet (device_group='cpu' on a GPU topology, ...) drops its "
             "table from the plan: constrain sharding types, kernels and cache load factors")
    chosen = sorted((kernel, name) for name, (_, kernel) in found["tables"].items() if kernel not in _PLAIN_KERNELS)
    if chosen:
        kernel, name = chosen[0]
        fail(f"the planner's plan puts {name} on the {kernel} kernel: {_not_a_plain_kernel(kernel)}",
             "name the kernels in compute_kernels: fused, fused_uvm or fused_uvm_caching")
    hbm, comms = found["max HBM GiB"], found["max comms ms"]
    kinds = sorted({f"{kind} ({kernel})" for kind, kernel in found["tables"].values()})
    said = f"the planner's estimates for your plan ({', '.join(kinds)}): {hbm:.1f} GiB of HBM on the fullest rank, " \
           f"{comms:.2f} ms of communication per step on the busiest"
    if hbm > HBM_BUDGET_GIB and comms > COMMS_BUDGET_MS:
        fail(f"{said}: over both budgets ({HBM_BUDGET_GIB:g} GiB, {COMMS_BUDGET_MS:g} ms)",
             "start from a plan that meets one budget and change what breaks the other")
    if hbm > HBM_BUDGET_GIB:
        fail(f"{said}: over the memory budget of {HBM_BUDGET_GIB:g} GiB",
             "spread the big tables' bytes more evenly, or keep only part of their rows in HBM (a UVM cache): "
             "table-row-wise puts a whole 100 M-row table on one node, and some nodes get two")
    if comms > COMMS_BUDGET_MS:
        fail(f"{said}: over the communication budget of {COMMS_BUDGET_MS:g} ms",
             "row-wise sharding across all 64 GPUs reduce-scatters every bag's partial sums over the network; keep "
             "that traffic inside a node (table-row-wise or grid sharding)")
    step = found["max step ms"]
    if step > STEP_BUDGET_MS:
        uvm = sorted({kernel for _, kernel in found["tables"].values() if "uvm" in kernel})
        fail(f"{said}, but {step:.1f} ms for the embedding step in all on the busiest rank, over the "
             f"{STEP_BUDGET_MS:g} ms budget: "
             + (f"the {' and '.join(uvm)} kernel keeps rows in host memory, and every lookup that misses HBM reads "
                "them over PCIe, time the communication estimate does not show" if uvm else
                "the lookups themselves take that long by the planner's perf model"),
             "memory bought with time is not within budget: keep more rows in HBM (a larger cache load factor, or "
             "fused with a sharding type that spreads the big tables' bytes, such as grid)")
    passed(f"{said}, {step:.2f} ms for the embedding step in all: within the budgets ({HBM_BUDGET_GIB:g} GiB, "
           f"{COMMS_BUDGET_MS:g} ms of communication, {STEP_BUDGET_MS:g} ms a step)")


# fbgemm's training kernel (SplitTableBatchedEmbeddingBagsCodegen, the one DMP shards) stores an fp32 row as dim
# float32 values, an fp16 row as dim float16 values, and an int8 row as dim uint8 values followed by a float32 scale
# and a float32 bias (INT8_EMB_ROW_DIM_OFFSET = 8 bytes, FloatToFused8BitRowwiseQuantized's layout), unpadded:
# construct_split_state in fbgemm_gpu/split_table_batched_embeddings_ops_training.py. (Lab 11's inference rows
# differ: an fp16 scale and bias, 4 bytes, and rows padded to 16 bytes.)
INT8_SCALE_BIAS_BYTES = 8
_ELEMENT_BYTES = {"FP32": 4, "FP16": 2, "INT8": 1}


def row_bytes(table: Any) -> int:
    """Bytes of one row of `table` (an EmbeddingBagConfig) in fbgemm's training kernel: its values, and for int8 the
    float32 scale and bias after them."""
    kind = table.data_type.value
    return table.embedding_dim * _ELEMENT_BYTES[kind] + (INT8_SCALE_BIAS_BYTES if kind == "INT8" else 0)


def _ids_per_feature(kjt: Any) -> dict[str, int]:
    return dict(zip(kjt.keys(), (int(n) for n in kjt.length_per_key())))


def _table_of(tables: Sequence[Any]) -> dict[str, Any]:
    return {feature: table for table in tables for feature in table.feature_names}


def lookup_bytes(kjt: Any, tables: Sequence[Any]) -> int:
    """Bytes a lookup of `kjt` reads: one row of its feature's table per id, repeated ids and all."""
    table_of = _table_of(tables)
    return sum(n * row_bytes(table_of[key]) for key, n in _ids_per_feature(kjt).items())


def _lookup_cases() -> list[tuple[Any, list[Any], float, str]]:
    """(kjt, tables, seconds, how a message names the case): fresh feature sets the lab has not shown."""
    import torch
    from torchrec import EmbeddingBagConfig, KeyedJaggedTensor
    from torchrec.types import DataType

    def table(name: str, dim: int, kind: DataType, features: list[str]) -> Any:
        return EmbeddingBagConfig(name=name, embedding_dim=dim, num_embeddings=10_000, feature_names=features, data_type=kind)

    def kjt(lengths: dict[str, list[int]], seed: int) -> Any:
        g = torch.Generator().manual_seed(seed)
        flat = [n for per_bag in lengths.values() for n in per_bag]
        ids = torch.randint(0, 50, (sum(flat),), generator=g)  # few distinct ids: many repeat
        return KeyedJaggedTensor(keys=list(lengths), values=ids, lengths=torch.tensor(flat))

    one = [table("t_item", 96, DataType.FP32, ["item"])]
    mixed = [table("t_user", 128, DataType.FP32, ["user"]),
             table("t_item", 64, DataType.FP16, ["item", "clicked"]),  # one table, two features
             table("t_cat", 32, DataType.INT8, ["category"])]
    narrow = [table("t_query", 16, DataType.INT8, ["query"]), table("t_ad", 48, DataType.FP16, ["ad"]),
              table("t_geo", 8, DataType.FP32, ["geo"])]
    return [
        (kjt({"item": [20] * 64}, 1), one, 0.0004, "one fp32 table of dim 96, 64 bags of 20 ids"),
        # the KJT's keys in another order than the tables, bags of different lengths, one of them empty
        (kjt({"category": [3, 0, 5, 2], "clicked": [7, 1, 4, 6], "user": [1, 1, 1, 1], "item": [2, 9, 0, 3]}, 2), mixed,
         0.00002, "3 tables (fp32 dim 128, fp16 dim 64 read by 2 features, int8 dim 32), 4 features in another order"),
        # one table no feature of the batch reads
        (kjt({"ad": [5, 5, 5], "query": [12, 0, 30]}, 3), narrow, 0.000015,
         "3 tables (int8 dim 16, fp16 dim 48, fp32 dim 8), a batch of 2 of their features"),
    ]


def _lookup_mistakes(kjt: Any, tables: Sequence[Any]) -> dict[str, float]:
    """Bytes that plausible wrong answers count for `kjt` over `tables`, with what each one did."""
    table_of, ids = _table_of(tables), _ids_per_feature(kjt)
    first = tables[0]
    values = {key: table_of[key].embedding_dim * _ELEMENT_BYTES[table_of[key].data_type.value] for key in ids}
    mistakes = {
        "it counts every id with the first table's row (one dim and one type for all): each feature's ids read rows "
        "of its own table, the one whose feature_names list it":
            sum(n * row_bytes(first) for n in ids.values()),
        "it counts 4 bytes per element whatever the table's data_type: an fp16 element is 2 bytes, an int8 one 1":
            sum(n * table_of[k].embedding_dim * 4 for k, n in ids.items()),
        "it counts an int8 row as its values alone: fbgemm's training kernel stores a float32 scale and a float32 "
        "bias after them, 8 bytes more, and a lookup reads them to dequantize the row":
            sum(n * values[k] for k, n in ids.items()),
        "it counts an int8 row's scale and bias as 4 bytes, the layout of lab 11's inference kernel: the training "
        "kernel keeps them in float32, 4 bytes each":
            sum(n * (values[k] + (4 if table_of[k].data_type.value == "INT8" else 0)) for k, n in ids.items()),
        "it counts bits: DATA_TYPE_NUM_BITS is in bits, 8 to a byte":
            sum(n * table_of[k].embedding_dim * _ELEMENT_BYTES[table_of[k].data_type.value] * 8 for k, n in ids.items()),
        "it counts bags, not ids: a bag of 20 ids reads 20 rows (kjt.lengths() holds ids per bag; count the values)":
            sum(len(kjt[k].lengths()) * row_bytes(table_of[k]) for k in ids),
        "it counts each distinct id once: a lookup reads a row for every id, repeats too":
            sum(len(set(kjt[k].values().tolist())) * row_bytes(table_of[k]) for k in ids),
        "it pairs the KJT's keys with the tables in order: find each feature's table by its feature_names, as "
        "the keys need not come in the tables' order":
            sum(n * row_bytes(t) for (k, n), t in zip(ids.items(), tables)),
        "it counts each table's first feature only: a table can serve several features (feature_names), and each "
        "one's ids read its rows":
            sum(ids.get(t.feature_names[0], 0) * row_bytes(t) for t in tables),
    }
    return {why: float(b) for why, b in mistakes.items()}


@exercise
def check_lookup_bandwidth(lookup_gb_per_s: Callable[..., Any]) -> None:
    """`lookup_gb_per_s(kjt, tables, seconds)`: decimal GB/s of the rows a lookup of `kjt` read, each feature's ids
    reading rows of its own table (fp32, fp16 or int8 with its scale and bias) in `seconds`. The check calls it
    on three fresh feature sets and batches (_lookup_cases)."""
    if not callable(lookup_gb_per_s):
        fail(f"expected the function, got {lookup_gb_per_s!r}",
             "pass the function itself: lab09.check_lookup_bandwidth(lookup_gb_per_s); the check calls it")
    for kjt, tables, seconds, what in _lookup_cases():
        expected = lookup_bytes(kjt, tables) / seconds / 1e9
        try:
            got = checked_call("lookup_gb_per_s", lookup_gb_per_s, kjt, tables, seconds)
        except CheckFailed:
            raise
        except Exception as error:
            raise_if_unwritten(error)
            fail(f"lookup_gb_per_s raised {one_line(error)} for {what}",
                 "it takes a KeyedJaggedTensor, a list of EmbeddingBagConfig and the seconds: lookup_gb_per_s(kjt, tables, "
                 "seconds)" if isinstance(error, TypeError) else "each key of the KJT is a feature; its table is the one "
                 "whose feature_names list it")
        if not is_number(got):
            fail(f"lookup_gb_per_s returned {type(got).__name__} {got!r} for {what}",
                 "return a number, gigabytes (1e9 bytes) per second: int(...) or float(...) of a tensor's value")
        got = float(got)
        if math.isclose(got, expected, rel_tol=1e-6):
            continue
        said = f"for {what}, in {seconds * 1e3:g} ms: got {got:.4g} GB/s, expected {expected:.4g}"
        for why, wrong in _lookup_mistakes(kjt, tables).items():
            if wrong != lookup_bytes(kjt, tables) and math.isclose(got, wrong / seconds / 1e9, rel_tol=1e-6):
                fail(f"{said}: {why}")
        ratio = got / expected if expected else float("inf")
        hints = {
            2.0: "a lookup reads the rows; nothing is written back to the table in a forward pass",
            1e3: "seconds are seconds: 1 GB/s is 1e9 bytes per second",
            1e-3: "seconds are seconds: 1 GB/s is 1e9 bytes per second",
            1 / 1.073741824: "GB here is decimal (1e9 bytes), as bandwidths are quoted, not GiB",
            1.073741824: "GB here is decimal (1e9 bytes), as bandwidths are quoted, not GiB",
        }
        fail(said, next((h for r, h in hints.items() if math.isclose(ratio, r, rel_tol=1e-3)),
                        "bytes read = for each feature, its ids x the bytes of a row of its table; divide by the "
                        "seconds and by 1e9"))
    passed(f"lookup bandwidth: each id reads a row of its own table, fp32, fp16 or int8 with its scale and bias "
           f"({len(_lookup_cases())} fresh feature sets), in GB/s")


# (nnodes, nproc_per_node, head, port) of the jobs the torchrun check asks for: two nodes of one process on this
# machine (the lab runs that one), eight 8-GPU nodes on a cluster at torchrun's c10d default port, one node.
_TORCHRUN_JOBS = ((2, 1, "127.0.0.1", 29411), (8, 8, "node-a17", 29400), (1, 4, "127.0.0.1", 29533))
_RDZV_BACKENDS = ("static", "c10d")


def torchrun_meaning(argv: Sequence[str]) -> dict[str, Any]:
    """What torchrun would do with `argv` (``["torchrun", ...]``), worked out with torchrun's own parser and rules
    (``torch.distributed.run``: ``get_args_parser``, the ``--standalone`` and single-node overrides of ``run``,
    ``parse_min_max_nnodes``, ``get_rdzv_endpoint``, and the rendezvous backends' endpoint parsing).

    Returns the effective rendezvous (backend, host, port, id), the node range, the node rank (static only),
    the processes per node (as given, and as the number torchrun reads from it: ``determine_local_world_size``,
    None for auto, gpu, cpu), whether this node says it hosts the c10d store (``--rdzv-conf is_host=...``, as
    ``_create_tcp_store`` reads it; None when unsaid, or with static, which ignores it) and the program. Raises
    ValueError with torchrun's complaint when it would refuse.
    """
    import contextlib
    import io
    import os
    from unittest import mock

    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.utils import _parse_rendezvous_config, parse_rendezvous_endpoint
    from torch.distributed.run import get_args_parser, parse_min_max_nnodes

    argv = list(argv)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PET_")}  # torchrun reads PET_* too
    with mock.patch.dict(os.environ, clean, clear=True):
        said = io.StringIO()
        try:
            with contextlib.redirect_stderr(said):  # argparse prints usage and exits: keep its one-line verdict
                args = get_args_parser().parse_args(argv[1:])
        except SystemExit:
            verdict = [line for line in said.getvalue().splitlines() if ": error: " in line]
            raise ValueError(verdict[-1].split(": error: ", 1)[1] if verdict else "its argument parser refuses it") from None
    try:
        min_nodes, max_nodes = parse_min_max_nnodes(args.nnodes)
    except (RuntimeError, ValueError):
        raise ValueError(f"--nnodes {args.nnodes} is neither N nor MIN:MAX") from None
    if not 0 < min_nodes <= max_nodes:
        raise ValueError(f"--nnodes {args.nnodes}: torchrun needs 0 < MIN <= MAX")
    backend, endpoint, run_id, port_given = args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id, args.master_port
    overridden = None
    if args.standalone:  # run(): a private c10d store on this machine, a fresh id, whatever else was said
        backend, endpoint, run_id, overridden = "c10d", "localhost:0", "<random per node>", "--standalone"
    elif backend == "static" and not endpoint and port_given is None and max_nodes == 1:
        backend, endpoint, run_id, overridden = "c10d", "localhost:0", "<random per node>", "single node"
    master_port = 29500 if port_given is None else port_given
    if backend == "static":
        endpoint = endpoint or f"{args.master_addr}:{master_port}"  # get_rdzv_endpoint
        host, port = parse_rendezvous_endpoint(endpoint, -1)
        if port == -1:
            raise ValueError(f"the static rendezvous endpoint {endpoint!r} has no port")
    else:
        host, port = parse_rendezvous_endpoint(endpoint, 29400)  # c10d's DEFAULT_PORT
    try:
        configs = _parse_rendezvous_config(args.rdzv_conf)
        is_host = RendezvousParameters(backend, endpoint, run_id, min_nodes, max_nodes, **configs).get_as_bool("is_host")
    except ValueError as error:
        raise ValueError(f"--rdzv-conf {args.rdzv_conf}: {error}") from None
    try:
        local_world_size = int(args.nproc_per_node)  # determine_local_world_size
    except ValueError:
        local_world_size = None
    return {
        "backend": backend, "host": host, "port": port, "id": run_id, "overridden": overridden,
        "endpoint_given": bool(args.rdzv_endpoint), "master_given": (args.master_addr != "127.0.0.1" or port_given is not None),
        "nodes": (min_nodes, max_nodes), "node_rank": args.node_rank if backend == "static" else None,
        "nproc_per_node": args.nproc_per_node, "local_world_size": local_world_size,
        "is_host": is_host if backend == "c10d" else None, "module": args.module, "no_python": args.no_python,
        "run_path": args.run_path, "script": args.training_script, "script_args": list(args.training_script_args),
    }


@exercise
def check_torchrun_command(torchrun_command: Callable[..., Sequence[str]]) -> None:
    """`torchrun_command(nnodes, nproc_per_node, node_rank, head, port)`: the argv that starts the capstone on one node.

    For each of three jobs (2 nodes x 1 process here, 8 nodes x 8 GPUs, 1 node x 4) the check asks for every
    node's command and judges what torchrun would do with them (``torchrun_meaning``), not how they are
    spelled: static (``--master-addr/--master-port`` and a ``--node-rank`` per node) and c10d
    (``--rdzv-backend c10d --rdzv-endpoint head:port``) rendezvous are both right.
    """
    for nnodes, nproc, head, port in _TORCHRUN_JOBS:
        meanings = []
        for node_rank in range(nnodes):
            where = f"node {node_rank} of {nnodes} ({nproc} process{'es' if nproc > 1 else ''} each, head {head}, port {port})"
            argv = checked_call("torchrun_command", torchrun_command, nnodes, nproc, node_rank, head, port)
            if isinstance(argv, str) or not argv or not all(isinstance(a, str) for a in argv):
                fail(f"expected a list of strings, got {argv!r}",
                     "e.g. ['torchrun', '--nnodes', '2', ...]: one string per argument, numbers as str(...)")
            argv = list(argv)
            if argv[0] != "torchrun":
                fail(f"the command starts with {argv[0]!r}", "start it with 'torchrun' (the cell below runs it)")
            try:
                meaning = torchrun_meaning(argv)
            except ValueError as error:
                fail(f"{where}: torchrun would refuse {' '.join(argv[1:])}: {error}",
                     "write flags as torchrun spells them, each followed by its value: --nnodes 2 --nproc-per-node 1")
            meanings.append(meaning)
            low, high = meaning["nodes"]
            if high != nnodes or (meaning["backend"] == "static" and low != nnodes):
                fail(f"{where}: --nnodes says {low if low == high else f'{low}:{high}'}",
                     "--nnodes is the number of machines (torchrun per machine), not of processes"
                     + ("" if meaning["backend"] != "static" else "; a static rendezvous needs exactly that many"))
            if meaning["local_world_size"] != nproc:
                hint = ("that is the world size: torchrun starts --nproc-per-node processes on THIS node, one per local GPU"
                        if meaning["local_world_size"] == nnodes * nproc else
                        "pass the number you were given: 'auto' and 'gpu' count this machine's devices (or CPU cores)"
                        if meaning["local_world_size"] is None else
                        "torchrun starts that many processes on THIS node: one per local GPU, not the world size")
                fail(f"{where}: --nproc-per-node is {meaning['nproc_per_node']}", hint)
            if meaning["overridden"] == "--standalone" and nnodes > 1:
                fail(f"{where}: --standalone makes torchrun start its own rendezvous on this machine (localhost:0, "
                     "a random id) and ignore the rendezvous you gave: the nodes never meet",
                     "--standalone is for one-node jobs only; drop it on a multi-node job")
            if meaning["backend"] not in _RDZV_BACKENDS:
                fail(f"{where}: rendezvous backend {meaning['backend']!r}",
                     "use the static rendezvous (--master-addr/--master-port, --node-rank) or c10d (--rdzv-backend c10d "
                     "--rdzv-endpoint head:port); etcd needs an etcd server nobody started")
            if nnodes > 1 and (meaning["host"], meaning["port"]) != (head, port):
                if meaning["backend"] == "c10d" and not meaning["endpoint_given"]:
                    fail(f"{where}: c10d rendezvous without --rdzv-endpoint: each node would host its own store on "
                         "localhost:29400 and wait for the others there",
                         "with c10d, torchrun ignores --master-addr/--master-port: give every node "
                         f"--rdzv-endpoint {head}:{port}")
                fail(f"{where}: the rendezvous is at {meaning['host']}:{meaning['port']}",
                     f"every node meets at the head node: {head}:{port} (--master-addr {head} --master-port {port}, "
                     f"or --rdzv-endpoint {head}:{port} with c10d); torchrun's static default port is 29500")
            if nnodes > 1 and meaning["is_host"] is not None and meaning["is_host"] != (node_rank == 0):
                fail(f"{where}: --rdzv-conf is_host={str(meaning['is_host']).lower()} "
                     + ("tells the head, node 0, not to host the c10d store: no node starts it, and every node "
                        f"fails to connect to {head}:{port}" if node_rank == 0 else
                        f"makes this node start a c10d store of its own: it is not the head ({head}:{port}), and the "
                        "other nodes never connect to it"),
                     "leave is_host unset: c10d hosts the store on the node whose address is the endpoint's")
            if meaning["no_python"] or meaning["run_path"] or not meaning["module"] or meaning["script"] != "course_lib.run":
                fail(f"{where}: torchrun would run {meaning['script']!r} as "
                     f"{'a module' if meaning['module'] else 'a program' if meaning['no_python'] else 'a script file'}",
                     "run the course's runner as a module: -m course_lib.run course_lib.capstone:train")
            if meaning["script_args"] != ["course_lib.capstone:train"]:
                fail(f"{where}: course_lib.run gets {meaning['script_args']}",
                     "its only argument is the function, course_lib.capstone:train (the cell below appends the steps "
                     "and the batch size)")
        if nnodes == 1:
            continue
        shared = {(m["backend"], m["host"], m["port"], m["id"], m["nodes"]) for m in meanings}
        if len(shared) > 1:
            ids = sorted({m["id"] for m in meanings})
            fail(f"{nnodes} nodes: the nodes' rendezvous differ ({'--rdzv-id ' + ', '.join(ids) if len(ids) > 1 else 'endpoints'})",
                 "every node must name the same rendezvous: the same backend, endpoint, --rdzv-id and --nnodes")
        if meanings[0]["backend"] == "static":
            ranks = [m["node_rank"] for m in meanings]
            if sorted(ranks) != list(range(nnodes)):
                fail(f"{nnodes} nodes with a static rendezvous: their --node-rank values are {ranks}",
                     "every node needs its own rank, 0 to nnodes - 1 (without --node-rank all say 0); or let c10d "
                     "assign them")
    passed("torchrun would start every node of the three jobs (2 x 1, 8 x 8, 1 x 4) into one rendezvous (at the head node, for the two jobs of several nodes)")
