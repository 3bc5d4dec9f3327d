"""The capstone job: lab 04's DLRM, sharded by DMP, trained and evaluated on the click log, on any number of ranks.

    torchrun --nproc-per-node 2 -m course_lib.run course_lib.capstone:train 120 512       # one node
    torchrun --nnodes 2 --nproc-per-node 8 --node-rank $NODE_RANK --master-addr $HEAD --master-port 29500 \\
        -m course_lib.run course_lib.capstone:train                                       # two GPU nodes
    launch(capstone.train, world_size=2)                                                  # from a notebook

:func:`train` runs on every rank and reads nothing but the process group and torchrun's variables
(``LOCAL_WORLD_SIZE``, ``GROUP_RANK``), so the same function runs under ``launch()``, under torchrun on one
machine, and across nodes. :func:`memory_scaling` measures how the per-rank memory of the two halves of a
big model shrinks with the number of ranks: row-wise sharded tables (DMP) and a dense model under FSDP2,
each against its formula.
"""
from __future__ import annotations

import ast
import math
import os
import re
import socket
import subprocess
import sys
import warnings
from typing import TYPE_CHECKING, Any, Sequence

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    import pandas

__all__ = ["free_port", "memory_on_rank", "memory_scaling", "returned", "run_nodes", "train"]


def train(
    steps: int = 120,
    batch_size: int = 512,
    num_train: int = 100_000,
    seed: int = 0,
    checkpoint_dir: str | None = None,
    checkpoint_every: int = 10,
) -> dict[str, Any]:
    """Train the click DLRM for `steps` steps of `batch_size` rows per rank, then score the test split.

    The click log (``data.make_click_log``, `num_train` training rows, seeded) is made on every rank; the
    planner plans the tables for this job's topology (world size, ranks per node, CPU or CUDA) on rank 0
    and broadcasts the plan; training is ``course_lib.training``'s loop (fused Adagrad tables, Adam for
    the dense part). Returns plain data: where the rank runs (`rank`, `node`, `local_rank`), the mean loss
    of its first and its last 10 steps (its own batches: they differ from rank to rank, though two ranks'
    means may round alike), and, the same on every rank, the test AUC of all ranks' scores and the test
    split's Bayes-optimal AUC.

    With `checkpoint_dir` (a folder every rank can reach), the job saves a DCP checkpoint of the model, its
    optimizers and the step there every `checkpoint_every` steps and after the last one, and first resumes
    from the newest complete one it finds (``checkpoint.latest``): a resubmitted job carries on where the
    failed one last saved, on the same data (``checkpoint.batch_at``: the order is a function of the step),
    and ends as the uninterrupted job would. It then also returns `resumed_from` (the step it loaded, 0 for
    a fresh start) and `checkpoint` (the folder it saved last); `steps` is the step reached, and the losses
    are those of the steps this job ran (None if it had none left to run).
    """
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner

    from course_lib import data, models, planning, training

    rank, world_size = dist.get_rank(), dist.get_world_size()
    log = data.make_click_log(data.ClickLogConfig(num_train=num_train, seed=seed))
    torch.manual_seed(seed)  # the same initial dense weights on every rank
    model = models.click_dlrm(log.tables(16), log.config.num_dense, device="meta")
    device = training.device()
    topology = planning.topology(
        world_size,
        local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", world_size)),
        compute_device="cuda" if device.type == "cuda" else "cpu",
    )
    plan = EmbeddingShardingPlanner(topology=topology).collective_plan(model, training.sharders(), dist.group.WORLD)
    dmp = DistributedModelParallel(model, device=device, plan=plan, sharders=training.sharders())
    steps_per_epoch = len(log.train) // (batch_size * world_size)
    if steps_per_epoch == 0:
        raise ValueError(f"{len(log.train)} training rows make no step of {batch_size} rows x {world_size} ranks")
    optimizer = training.optimizer(dmp)
    if checkpoint_dir is None:
        epochs = math.ceil(steps / steps_per_epoch)
        losses = training.train(dmp, optimizer, log.train, batch_size, epochs, max_steps=steps, desc=None)
        resumed: dict[str, Any] = {}
    else:
        losses, resumed = _train_with_checkpoints(dmp, optimizer, log.train, batch_size, steps, checkpoint_dir,
                                                  checkpoint_every)
    logits, labels = training.predict(dmp, log.test)
    window = min(10, len(losses))
    return {
        "node": int(os.environ.get("GROUP_RANK", "0")),
        "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
        "rank": rank,
        "world_size": world_size,
        "steps": resumed.get("steps", len(losses)),
        "first_loss": round(sum(losses[:window]) / window, 4) if losses else None,
        "last_loss": round(sum(losses[-window:]) / window, 4) if losses else None,
        "auc": round(training.auc(logits, labels), 4),
        "optimal_auc": round(data.bayes_optimal_auc(log.test), 4),
        **{key: value for key, value in resumed.items() if key != "steps"},
    }


def _train_with_checkpoints(
    dmp: torch.nn.Module, optimizer: Any, split: Any, batch_size: int, steps: int, root: str, every: int
) -> tuple[list[float], dict[str, Any]]:
    """:func:`train`'s loop with DCP checkpoints (lab 08): resume from the newest under `root`, save every
    `every` steps and after the last. Returns this job's losses and ``{"steps", "resumed_from", "checkpoint"}``."""
    import torch.distributed.checkpoint as dcp

    from course_lib import checkpoint, training

    if every < 1:
        raise ValueError(f"checkpoint_every must be at least 1, got {every}")
    app = checkpoint.AppState(dmp, optimizer)
    last = checkpoint.latest(root)  # the same folder on every rank: the newest with DCP's .metadata
    if last is not None:
        checkpoint.init_optimizer_state(optimizer)  # Adam's lazy state must exist to be loaded into
        dcp.load({"app": app}, checkpoint_id=last)
    resumed_from = app.step
    device = training.device()
    dmp.train()
    losses = []
    while app.step < steps:
        batch = checkpoint.batch_at(split, app.step, batch_size).to(device)
        losses.append(training.train_step(dmp, optimizer, batch))
        app.step += 1
        if app.step % every == 0 or app.step == steps:
            last = os.path.join(root, checkpoint.step_folder(app.step))
            dcp.save({"app": app}, checkpoint_id=last)
    return losses, {"steps": app.step, "resumed_from": resumed_from, "checkpoint": None if last is None else str(last)}


# ------------------------------------------------------------------------------ several "nodes" on one machine


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for a rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_nodes(commands: Sequence[Sequence[str]], timeout: float = 300, cwd: str | None = None) -> list[str]:
    """Start every command at once (one per "node", e.g. a torchrun each) and return their outputs, in order.

    A leading ``"torchrun"`` runs this Python's torchrun. The processes talk over loopback only
    (``GLOO_SOCKET_IFNAME=lo``): on a real cluster each command runs on its own machine instead. Raises
    RuntimeError with the output of every command that failed (or outran `timeout` seconds).
    """
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", PYTHONUNBUFFERED="1")
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    processes = [
        subprocess.Popen(
            [torchrun, *command[1:]] if command[0] == "torchrun" else list(command),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd,
        )
        for command in commands
    ]
    outputs = []
    try:
        for process in processes:
            outputs.append(process.communicate(timeout=timeout)[0])
    except subprocess.TimeoutExpired:
        for process in processes:
            process.kill()
        raise RuntimeError(f"the nodes did not finish within {timeout} s") from None
    failed = [(i, p.returncode, out) for i, (p, out) in enumerate(zip(processes, outputs)) if p.returncode != 0]
    if failed:
        raise RuntimeError("\n".join(f"node {i} exited with {code}:\n{out[-3000:]}" for i, code, out in failed))
    return outputs


def returned(output: str) -> list[dict[str, Any]]:
    """The values that ``course_lib.run`` printed ("[course_lib.run] rank r/n (...) returned: VALUE") in `output`."""
    return [ast.literal_eval(m.group(1)) for m in re.finditer(r"^\[course_lib\.run\] rank \d+/\d+ \(\w+\) returned: (.*)$", output, re.M)]


# ------------------------------------------------------------------------------------- memory per rank


def memory_on_rank(num_embeddings: int = 50_000, embedding_dim: int = 64, num_tables: int = 4) -> dict[str, int]:
    """Run on every rank: the bytes this rank holds for row-wise sharded tables, and for an FSDP2 model.

    Tables: `num_tables` tables of `num_embeddings` x `embedding_dim` float32, every one row-wise over all
    ranks (``planning.one_type_plan``), in DistributedModelParallel; the bytes are this rank's local
    shards. FSDP: lab 06's ``TinyTransformer`` under ``fully_shard`` (``fsdp.parallelize``) after one Adam
    step; the bytes are its parameters + gradients + optimizer state (``memory.measure``).
    """
    from course_lib import bench, fsdp, memory, models, planning, sharding

    world_size = dist.get_world_size()
    tables = bench.make_tables(num_tables, num_embeddings, embedding_dim)
    dmp = sharding.shard(tables, planning.one_type_plan(tables, "row_wise", world_size=world_size))
    table_bytes = sum(
        shard.tensor.numel() * shard.tensor.element_size()
        for value in dmp.state_dict().values()
        if hasattr(value, "local_shards")
        for shard in value.local_shards()
    )
    torch.manual_seed(0)
    model = models.TinyTransformer()
    num_params = memory.count_params(model)
    fsdp.parallelize(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    tokens = models.counting_tokens(4, 16)
    models.next_token_loss(model(tokens), tokens).backward()
    optimizer.step()
    return {
        "table_bytes": table_bytes,
        "table_bytes_total": sum(t.num_embeddings * t.embedding_dim * 4 for t in tables),
        "fsdp_bytes": memory.measure(model, optimizer).total,
        "fsdp_params": num_params,
    }


def memory_scaling(world_sizes: Sequence[int] = (1, 2, 4), **table_sizes: int) -> "pandas.DataFrame":
    """Per-rank bytes (the largest rank's) at each world size, measured by :func:`memory_on_rank`, beside the formulas.

    Formulas: row-wise tables hold ``ceil(rows / world_size)`` rows of every table per rank; FSDP holds
    ``memory.zero_bytes(num_params, world_size, stage=3)`` (fp32 Adam: 16 bytes per parameter, divided by
    the world size). "x formula" is measured / formula. More ranks than cores is fine here: only bytes
    are measured.
    """
    import pandas as pd

    from course_lib import launch, memory

    rows = []
    for world_size in world_sizes:
        with warnings.catch_warnings():  # launch warns when ranks outnumber cores: they only take turns
            warnings.simplefilter("ignore", UserWarning)
            per_rank = launch(memory_on_rank, world_size=world_size, show_ranks=[], **table_sizes)
        first = per_rank[0]
        num_embeddings = table_sizes.get("num_embeddings", 50_000)
        table_formula = first["table_bytes_total"] // num_embeddings * math.ceil(num_embeddings / world_size)
        fsdp_formula = memory.zero_bytes(first["fsdp_params"], world_size, stage=3).total
        tables_measured = max(r["table_bytes"] for r in per_rank)
        fsdp_measured = max(r["fsdp_bytes"] for r in per_rank)
        rows.append(
            {
                "ranks": world_size,
                "tables MiB/rank": tables_measured / 2**20,
                "tables formula MiB": table_formula / 2**20,
                "tables x formula": tables_measured / table_formula,
                "FSDP MiB/rank": fsdp_measured / 2**20,
                "FSDP formula MiB": fsdp_formula / 2**20,
                "FSDP x formula": fsdp_measured / fsdp_formula,
            }
        )
    return pd.DataFrame(rows).set_index("ranks")
