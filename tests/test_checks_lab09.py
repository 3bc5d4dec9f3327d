"""The 09_scale checks accept the solutions and reject plausible wrong answers."""
from __future__ import annotations

import pytest
import torch

from course_lib.checks import CheckFailed, lab09


def search_solution(hbm_gib=16):  # the solution's search, with the HBM per GPU as its argument
    for factor in sorted(lab09.LOAD_FACTORS, reverse=True):
        if lab09.plan_fits(factor, hbm_gib):
            return factor


def test_load_factor_check_accepts_the_search_that_found_it(capsys):
    lab09.check_load_factor(search_solution)
    assert capsys.readouterr().out.startswith("✓ load factor 0.75: the largest cache that fits 64 GPUs of 16 GiB "
                                              "(and your search finds 0.9 for 20 GiB)")


def test_the_menu_holds_only_load_factors_torchrec_takes():
    # validate_compute_kernels refuses a caching kernel at 1.0 whatever the memory: on the menu, 1.0 would be a
    # factor that "does not fit" though its plan fits 20 GiB
    assert all(0 < factor < 1 for factor in lab09.LOAD_FACTORS)


def test_load_factor_check_wants_the_function():
    with pytest.raises(CheckFailed, match="expected the function that searches the menu, got 0.75"):
        lab09.check_load_factor(0.75)


@pytest.mark.parametrize("search, words", [
    (lambda hbm_gib=16: 0.75, "gives 0.75, but the largest cache that fits there is 0.9: the same answer as for 16 GiB"),
    (lambda hbm_gib=16: search_solution(16), "as if typed in or planned for 16 GiB whatever hbm_gib says"),  # ignores hbm_gib
    (lambda: search_solution(16), "your search raised TypeError"),  # no argument to take the HBM
])
def test_load_factor_check_rejects_a_typed_in_answer(search, words):  # the value read off the prose, not searched
    with pytest.raises(CheckFailed, match=words):
        lab09.check_load_factor(search)


@pytest.mark.parametrize(
    "answer, words",
    [
        (0.9, "finds no plan"),
        (0.25, "so does 0.5"),  # fits, but wastes HBM
        (0.3, "not one of the load factors"),
        (0.1, "so does 0.25"),  # the smallest cache: fits, and misses the most
        (0.5, "so does 0.75"),
        ("0.75", "not one of the load factors"),  # a string, not the number
    ],
)
def test_load_factor_check_rejects_wrong_answers(answer, words):
    with pytest.raises(CheckFailed, match=words):
        lab09.check_load_factor(lambda hbm_gib=16: answer if hbm_gib == lab09.HBM_GIB else search_solution(hbm_gib))


ELEMENT_BYTES = {"FP32": 4, "FP16": 2, "INT8": 1}


def lookup_solution(kjt, tables, seconds):
    table_of = {feature: t for t in tables for feature in t.feature_names}
    read = 0
    for key, ids in zip(kjt.keys(), kjt.length_per_key()):
        t = table_of[key]
        row = t.embedding_dim * ELEMENT_BYTES[t.data_type.value] + (8 if t.data_type.value == "INT8" else 0)
        read += ids * row
    return read / seconds / 1e9


def test_lookup_check_accepts_the_solution(capsys):
    lab09.check_lookup_bandwidth(lookup_solution)
    assert capsys.readouterr().out.startswith("✓")


def test_lookup_check_accepts_a_numpy_number_and_torchrecs_own_sizes(capsys):
    import numpy as np
    from torchrec.modules.embedding_configs import DATA_TYPE_NUM_BITS

    def with_torchrec(kjt, tables, seconds):  # DATA_TYPE_NUM_BITS, and each feature's ids read from kjt[key]
        read = 0
        for key in kjt.keys():
            t = next(t for t in tables if key in t.feature_names)
            scale_bias = 8 if t.data_type.value == "INT8" else 0
            read += kjt[key].values().numel() * (t.embedding_dim * DATA_TYPE_NUM_BITS[t.data_type] // 8 + scale_bias)
        return np.float32(read / seconds / 1e9)

    lab09.check_lookup_bandwidth(with_torchrec)
    assert capsys.readouterr().out.startswith("✓")


def _variant(row=None, ids=None, per=1e9, time=lambda s: s, table=None):
    """lookup_solution with one part changed: a row's bytes, the ids counted per feature, the unit, the time, the
    table a feature reads."""
    def answer(kjt, tables, seconds):
        table_of = {feature: t for t in tables for feature in t.feature_names}
        read = 0
        for i, key in enumerate(kjt.keys()):
            t = table(tables, i) if table else table_of[key]
            kind = t.data_type.value
            size = row(t) if row else t.embedding_dim * ELEMENT_BYTES[kind] + (8 if kind == "INT8" else 0)
            read += (ids(kjt, key) if ids else kjt[key].values().numel()) * size
        return read / time(seconds) / per
    return answer


def _right_row(t):
    return t.embedding_dim * ELEMENT_BYTES[t.data_type.value] + (8 if t.data_type.value == "INT8" else 0)


@pytest.mark.parametrize(
    "wrong, words",
    [
        (_variant(table=lambda tables, i: tables[0]), "first table's row"),  # one dim and one type for all
        (_variant(row=lambda t: t.embedding_dim * 4), "4 bytes per element whatever"),  # dtype ignored
        (_variant(row=lambda t: t.embedding_dim * ELEMENT_BYTES[t.data_type.value]), "values alone"),  # no scale, bias
        (_variant(row=lambda t: t.embedding_dim * ELEMENT_BYTES[t.data_type.value] + 4 * (t.data_type.value == "INT8")),
         "lab 11's inference kernel"),
        (_variant(row=lambda t: 8 * t.embedding_dim * ELEMENT_BYTES[t.data_type.value]), "it counts bits"),
        (_variant(ids=lambda kjt, key: len(kjt[key].lengths())), "it counts bags, not ids"),
        (_variant(ids=lambda kjt, key: kjt[key].values().unique().numel()), "each distinct id once"),
        (lambda kjt, tables, s: sum(kjt[key].values().numel() * _right_row(t) for key, t in zip(kjt.keys(), tables))
         / s / 1e9, "pairs the KJT's keys with the tables in order"),
        (lambda kjt, tables, s: sum(kjt[t.feature_names[0]].values().numel() * _right_row(t) for t in tables
                                    if t.feature_names[0] in kjt.keys()) / s / 1e9, "each table's first feature only"),
        (_variant(per=2**30), "decimal"),  # GiB/s
        (_variant(time=lambda s: s * 1e3), "seconds are seconds"),  # the seconds read as milliseconds
        (lambda kjt, tables, s: 2 * lookup_solution(kjt, tables, s), "nothing is written"),  # counted like a copy
        (lambda kjt, tables, s: kjt.values().numel() * tables[0].embedding_dim * 4 / s / 1e9, "first table's row"),
        (lambda kjt, tables, s: "fast", "return a number"),
        (lambda kjt, tables, s: torch.tensor(lookup_solution(kjt, tables, s)), "return a number"),
        (lambda n, d, s, e=4: n * d * e / s / 1e9, "it takes a KeyedJaggedTensor"),  # the old signature
    ],
)
def test_lookup_check_rejects_wrong_answers(wrong, words):
    with pytest.raises(CheckFailed, match=words):
        lab09.check_lookup_bandwidth(wrong)


def torchrun_solution(nnodes, nproc_per_node, node_rank, head, port):
    return ["torchrun", "--nnodes", str(nnodes), "--nproc-per-node", str(nproc_per_node), "--node-rank", str(node_rank),
            "--master-addr", head, "--master-port", str(port), "-m", "course_lib.run", "course_lib.capstone:train"]


def c10d_solution(nnodes, nproc_per_node, node_rank, head, port):  # the lab's recommended cluster command
    return ["torchrun", "--nnodes", str(nnodes), "--nproc-per-node", str(nproc_per_node), "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"{head}:{port}", "--rdzv-id", "capstone-1", "-m", "course_lib.run", "course_lib.capstone:train"]


def underscores_and_equals(nnodes, nproc, node_rank, head, port):  # the same meaning, spelled the old way
    return ["torchrun", f"--nnodes={nnodes}", f"--nproc_per_node={nproc}", f"--node_rank={node_rank}",
            f"--master_addr={head}", f"--master_port={port}", "--module", "course_lib.run", "course_lib.capstone:train"]


def static_with_endpoint(nnodes, nproc, node_rank, head, port):  # static rendezvous at an explicit endpoint
    return ["torchrun", "--nnodes", str(nnodes), "--nproc-per-node", str(nproc), "--node-rank", str(node_rank),
            "--rdzv-endpoint", f"{head}:{port}", "-m", "course_lib.run", "course_lib.capstone:train"]


def elastic_c10d(nnodes, nproc, node_rank, head, port):  # elastic range up to the job's nodes, c10d default id
    return ["torchrun", "--nnodes", f"1:{nnodes}", "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"{head}:{port}", "-m", "course_lib.run", "course_lib.capstone:train"]


def nproc_zero_padded(nnodes, nproc, node_rank, head, port):  # torchrun reads int("01"): one process
    return torchrun_solution(nnodes, f"{nproc:02d}", node_rank, head, port)


def c10d_head_hosts(nnodes, nproc, node_rank, head, port):  # is_host said out loud: node 0, the head, hosts the store
    return [*c10d_solution(nnodes, nproc, node_rank, head, port)[:-3], "--rdzv-conf", f"is_host={node_rank == 0}",
            "-m", "course_lib.run", "course_lib.capstone:train"]


def static_with_is_host_false(nnodes, nproc, node_rank, head, port):  # the static rendezvous ignores is_host
    return ["torchrun", "--rdzv-conf", "is_host=false", *torchrun_solution(nnodes, nproc, node_rank, head, port)[1:]]


@pytest.mark.parametrize("right", [torchrun_solution, c10d_solution, underscores_and_equals, static_with_endpoint, elastic_c10d,
                                   nproc_zero_padded, c10d_head_hosts, static_with_is_host_false])
def test_torchrun_check_accepts_every_spelling_of_a_working_command(right, capsys):
    lab09.check_torchrun_command(right)
    assert capsys.readouterr().out.startswith("✓")


COMMAND: list = []


def one_command_list(nnodes, nproc, node_rank, head, port):  # every node's command is the last node's
    COMMAND[:] = torchrun_solution(nnodes, nproc, node_rank, head, port)
    return COMMAND


def test_torchrun_check_rejects_commands_that_share_one_list():
    # node 0's command becomes node 1's when node 1's is made: both nodes start as node 1, and the job never meets
    with pytest.raises(CheckFailed, match="calling torchrun_command again changed a list that an earlier call of it "
                                          "had returned"):
        lab09.check_torchrun_command(one_command_list)


def world_size_per_node(nnodes, nproc, node_rank, head, port):
    return torchrun_solution(nnodes, nnodes * nproc, node_rank, head, port)


def no_node_rank(nnodes, nproc, node_rank, head, port):
    argv = torchrun_solution(nnodes, nproc, node_rank, head, port)
    i = argv.index("--node-rank")
    return argv[:i] + argv[i + 2:]


def script_not_module(nnodes, nproc, node_rank, head, port):
    return [a for a in torchrun_solution(nnodes, nproc, node_rank, head, port) if a != "-m"]


def one_string(nnodes, nproc, node_rank, head, port):
    return " ".join(torchrun_solution(nnodes, nproc, node_rank, head, port))


def standalone_on_many_nodes(nnodes, nproc, node_rank, head, port):  # --standalone overrides the rendezvous
    return ["torchrun", "--standalone", *c10d_solution(nnodes, nproc, node_rank, head, port)[1:]]


def c10d_at_master_addr(nnodes, nproc, node_rank, head, port):  # c10d ignores --master-addr/--master-port
    return ["torchrun", "--nnodes", str(nnodes), "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d",
            "--master-addr", head, "--master-port", str(port), "-m", "course_lib.run", "course_lib.capstone:train"]


def no_master_port(nnodes, nproc, node_rank, head, port):  # static, at torchrun's default port 29500
    argv = torchrun_solution(nnodes, nproc, node_rank, head, port)
    i = argv.index("--master-port")
    return argv[:i] + argv[i + 2:]


def processes_as_nodes(nnodes, nproc, node_rank, head, port):  # --nnodes = every process of the job
    return torchrun_solution(nnodes * nproc, nproc, node_rank, head, port)


def gpus_auto(nnodes, nproc, node_rank, head, port):  # 'auto': this machine's devices, or its CPU cores
    return torchrun_solution(nnodes, "auto", node_rank, head, port)


def one_id_per_node(nnodes, nproc, node_rank, head, port):  # each node its own --rdzv-id: separate jobs
    argv = c10d_solution(nnodes, nproc, node_rank, head, port)
    argv[argv.index("capstone-1")] = f"capstone-node{node_rank}"
    return argv


def localhost_everywhere(nnodes, nproc, node_rank, head, port):  # the head's address hard-coded
    return torchrun_solution(nnodes, nproc, node_rank, "127.0.0.1", port)


def steps_in_the_command(nnodes, nproc, node_rank, head, port):  # the cell appends steps and batch: 4 arguments
    return torchrun_solution(nnodes, nproc, node_rank, head, port) + ["2000", "4096"]


def node_rank_from_one(nnodes, nproc, node_rank, head, port):  # ranks 1..nnodes
    return torchrun_solution(nnodes, nproc, node_rank + 1, head, port)


def etcd_backend(nnodes, nproc, node_rank, head, port):
    argv = c10d_solution(nnodes, nproc, node_rank, head, port)
    argv[argv.index("c10d")] = "etcd"
    return argv


def c10d_default_port(nnodes, nproc, node_rank, head, port):  # torchrun's c10d port typed in: right on the cluster only
    return ["torchrun", "--nnodes", str(nnodes), "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"{head}:29400", "-m", "course_lib.run", "course_lib.capstone:train"]


def node_rank_of_first_process(nnodes, nproc, node_rank, head, port):  # the global rank of the node's first process
    return torchrun_solution(nnodes, nproc, node_rank * nproc, head, port)


def no_store_host(nnodes, nproc, node_rank, head, port):  # is_host=false everywhere: nobody starts the c10d store
    return [*c10d_solution(nnodes, nproc, node_rank, head, port)[:-3], "--rdzv-conf", "is_host=false",
            "-m", "course_lib.run", "course_lib.capstone:train"]


def every_node_hosts(nnodes, nproc, node_rank, head, port):  # is_host=true everywhere: a store on every node
    return [*c10d_solution(nnodes, nproc, node_rank, head, port)[:-3], "--rdzv-conf", "join_timeout=60,is_host=1",
            "-m", "course_lib.run", "course_lib.capstone:train"]


def is_host_not_a_bool(nnodes, nproc, node_rank, head, port):
    return [*c10d_solution(nnodes, nproc, node_rank, head, port)[:-3], "--rdzv-conf", "is_host=head",
            "-m", "course_lib.run", "course_lib.capstone:train"]


def flag_without_value(nnodes, nproc, node_rank, head, port):
    return ["torchrun", "--nnodes", "--nproc-per-node", str(nproc), "-m", "course_lib.run", "course_lib.capstone:train"]


def the_labs_job(nnodes, nproc, node_rank, head, port):  # the lab's 2 x 1 job typed in: ignores nnodes and nproc
    return torchrun_solution(2, 1, node_rank, head, port)


def the_labs_port(nnodes, nproc, node_rank, head, port):  # the port of the lab's run typed in
    return torchrun_solution(nnodes, nproc, node_rank, head, 29411)


@pytest.mark.parametrize(
    "wrong, words",
    [
        (the_labs_job, "node 0 of 8 \\(8 processes each, head node-a17, port 29400\\): --nnodes says 2"),
        (the_labs_port, "rendezvous is at node-a17:29411"),
        (world_size_per_node, "that is the world size"),
        (no_node_rank, "its own rank"),
        (script_not_module, "as a module"),
        (one_string, "list of strings"),
        (standalone_on_many_nodes, "--standalone .* never meet"),
        (c10d_at_master_addr, "without --rdzv-endpoint"),
        (no_master_port, "rendezvous is at node-a17:29500|rendezvous is at 127.0.0.1:29500"),
        (processes_as_nodes, "--nnodes says 16|--nnodes says 64|number of machines"),
        (gpus_auto, "'auto' and 'gpu' count"),
        (one_id_per_node, "rendezvous differ"),
        (localhost_everywhere, "rendezvous is at 127.0.0.1"),
        (steps_in_the_command, "its only argument is the function"),
        (node_rank_from_one, "--node-rank values are \\[1, 2\\]"),
        (etcd_backend, "etcd"),
        (flag_without_value, "would refuse"),
        (c10d_default_port, "rendezvous is at 127.0.0.1:29400"),
        (node_rank_of_first_process, "--node-rank values are \\[0, 8, 16"),
        (no_store_host, "node 0 of 2 .*: --rdzv-conf is_host=false tells the head, node 0, not to host the c10d store"),
        (every_node_hosts, "node 1 of 2 .*: --rdzv-conf is_host=true makes this node start a c10d store of its own"),
        (is_host_not_a_bool, "would refuse .*'is_host' does not represent a valid boolean"),
    ],
)
def test_torchrun_check_rejects_wrong_answers(wrong, words):
    with pytest.raises(CheckFailed, match=words):
        lab09.check_torchrun_command(wrong)


# ------------------------------------------------------------------------ a plan under two budgets


def _every_table(sharding_type=None, kernel="fused", load_factor=None, names=None, **more):
    from torchrec.distributed.planner import ParameterConstraints
    from torchrec.distributed.types import CacheParams

    names = names or [t.name for t in lab09.production_tables()]
    return {name: ParameterConstraints(sharding_types=[sharding_type] if sharding_type else None, compute_kernels=[kernel],
                                       cache_params=CacheParams(load_factor=load_factor) if load_factor else None, **more)
            for name in names}


BIG = [f"t{i:02d}" for i in range(10)]


@pytest.mark.parametrize("right", [
    lambda: _every_table("grid_shard"),  # the lab's solution: every row in HBM, a node's traffic on NVLink
    lambda: _every_table("table_row_wise", "fused_uvm_caching", 0.75),  # a quarter of the big tables' rows on the host
    lambda: _every_table("grid_shard", pooling_factors=[1.0], is_weighted=False),  # the workload's defaults, spelled out
])
def test_budget_check_accepts_plans_within_both_budgets(right, capsys):
    lab09.check_budget_plan(right)
    assert capsys.readouterr().out.startswith("✓")


@pytest.mark.parametrize(
    "wrong, words",
    [
        (lambda: {}, "over the memory budget"),  # the planner's own choice: table-row-wise, 23.9 GiB on some ranks
        (lambda: _every_table(kernel="fused"), "over the memory budget"),
        (lambda: _every_table("row_wise"), "over the communication budget"),  # even bytes, partial sums over the network
        (lambda: _every_table("column_wise"), "over the memory budget"),
        (lambda: _every_table(kernel="fused_uvm_caching", load_factor=0.5), "over the memory budget"),  # cache, planner's layout
        (lambda: _every_table("row_wise", names=BIG), "over the communication budget"),  # only the big tables constrained
        (lambda: _every_table("table_wise"), "finds no plan"),
        (lambda: {**_every_table("grid_shard"), "t20": _every_table("grid_shard")["t00"]}, "t20 is not a table"),
        (lambda: [_every_table("grid_shard")], "expected a dict"),
        (lambda: {"t00": "grid_shard"}, "the constraint of t00 is a str"),
        # the workload described lighter than it is: row-wise then "meets" the comms budget (0.76 ms)
        (lambda: _every_table("row_wise", pooling_factors=[0.01]), "sets pooling_factors"),
        (lambda: _every_table("row_wise", batch_sizes=[16]), "sets batch_sizes"),
        (lambda: _every_table("row_wise", num_poolings=[0.1]), "sets num_poolings"),
        (lambda: _every_table("table_row_wise", is_weighted=True), "sets is_weighted"),
        # tables the GPU topology cannot take: the planner drops them, and an empty plan costs 0 GiB and 0 ms
        (lambda: _every_table("row_wise", device_group="cpu"), "places 0 of 20 tables"),
        # memory bought with time: every row in host memory (0.02 GiB of HBM, 2.5 ms of comms, 32 ms a step) ...
        (lambda: _every_table(kernel="fused_uvm"), "32.0 ms for the embedding step in all on the busiest rank, over the 8 ms"),
        # ... or a cache of a tenth of the rows: most lookups miss HBM and read host memory over PCIe
        (lambda: _every_table(kernel="fused_uvm_caching", load_factor=0.1), "fused_uvm_caching kernel keeps rows in host memory"),
        (lambda: _every_table("grid_shard", "fused_uvm_caching", 0.5), "9.3 ms for the embedding step in all"),
        # the training pipeline described to the estimators: with prefetch_pipeline every cached lookup is priced at
        # HBM speed, so a cache of 1% of the rows "passes" (0.4 GiB, 1.63 ms of comms, 1.86 ms a step)
        (lambda: _cached(0.01, "table_row_wise", prefetch_pipeline=True), "sets cache_params.prefetch_pipeline=True"),
        (lambda: _cached(0.5, "grid_shard", prefetch_pipeline=True), "a cache of 1% of the rows looks as fast"),
        (lambda: _cached(0.1, stats=_HitRate()), "sets cache_params.stats=.*describes the ids"),
        # virtual-table kernels keep every row off the GPU, priced at full host bandwidth (0.0 GiB, 5.45 ms a step),
        # and are no layout for plain EmbeddingBagConfigs
        (lambda: _every_table(kernel="dram_virtual_table"), "t00 allows the dram_virtual_table kernel: .* virtual"),
        (lambda: _every_table(kernel="ssd_virtual_table"), "with rows on SSD: these are plain tables"),
        (lambda: _every_table(kernel="dram_ssd_virtual_table"), "dram_ssd_virtual_table is a kernel for virtual"),
        (lambda: {**_every_table("grid_shard"), **_every_table(kernel="dram_virtual_table", names=BIG)},
         "t00 allows the dram_virtual_table kernel"),  # only the big tables off the GPU
        # the plain tables declared virtual: the planner sizes their rows at 0 bytes of HBM whatever the kernel, so
        # table-row-wise on fused "passes" (0.1 GiB, 1.63 ms of comms, 1.86 ms a step)
        (lambda: _every_table("table_row_wise", use_virtual_table=True), "t00 sets use_virtual_table=True: .*plain tables"),
        (lambda: _every_table(kernel="fused", use_virtual_table=True), "sets use_virtual_table=True"),
        (lambda: _every_table("table_row_wise", key_value_params=_kv()), "sets key_value_params="),
        # the enum, not its value: the planner matches kernel names, so no kernel of the sharder matches
        (lambda: _every_table("grid_shard", _fused_enum()), "is not a kernel's name.*FUSED.value"),
        # a cache of every row: torchrec refuses it after planning, whatever the memory (it was "no plan" before)
        (lambda: _cached(1.0, "table_row_wise"), "asks for a cache load factor of 1.0: torchrec refuses a caching kernel"),
        (lambda: _cached(0.0, "grid_shard"), "asks for a cache load factor of 0.0"),
    ],
)
def test_budget_check_rejects_wrong_answers(wrong, words):
    with pytest.raises(CheckFailed, match=words):
        lab09.check_budget_plan(wrong)


def _kv():
    from torchrec.distributed.types import KeyValueParams

    return KeyValueParams()


def _fused_enum():
    from torchrec.distributed.embedding_types import EmbeddingComputeKernel

    return EmbeddingComputeKernel.FUSED


def _cached(load_factor, sharding_type=None, **cache):
    from torchrec.distributed.planner import ParameterConstraints
    from torchrec.distributed.types import CacheParams

    return {t.name: ParameterConstraints(sharding_types=[sharding_type] if sharding_type else None,
                                         compute_kernels=["fused_uvm_caching"],
                                         cache_params=CacheParams(load_factor=load_factor, **cache))
            for t in lab09.production_tables()}


class _HitRate:  # a torchrec CacheStatistics that claims every lookup hits the cache
    expected_lookups = 1.0
    cacheability = 1.0

    def expected_miss_rate(self, clf):
        return 0.0


def test_budget_check_refuses_a_kernel_the_planner_chose(monkeypatch):
    """A constraint that leaves compute_kernels open lets the planner choose; a virtual-table kernel it chose is
    refused as one the learner named would be."""
    real = lab09.plan_estimates

    def virtual_t03(constraints):
        found = real(constraints)
        found["tables"]["t03"] = (found["tables"]["t03"][0], "dram_virtual_table")
        return found

    monkeypatch.setattr(lab09, "plan_estimates", virtual_t03)
    with pytest.raises(CheckFailed, match="the planner's plan puts t03 on the dram_virtual_table kernel"):
        lab09.check_budget_plan(lambda: _every_table("grid_shard"))


def test_budget_check_accepts_prefetch_pipeline_false(capsys):  # False is the estimators' default: no claim made
    from torchrec.distributed.planner import ParameterConstraints
    from torchrec.distributed.types import CacheParams

    lab09.check_budget_plan(lambda: {
        t.name: ParameterConstraints(sharding_types=["table_row_wise"], compute_kernels=["fused_uvm_caching"],
                                     cache_params=CacheParams(load_factor=0.75, prefetch_pipeline=False))
        for t in lab09.production_tables()})
    assert capsys.readouterr().out.startswith("✓")
