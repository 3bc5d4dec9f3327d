"""Cheaper tables, communication and serving (lab 11): what each technique saves, measured.

    variants = [cheaper.Variant("fp32"), cheaper.Variant("fp16 tables", table_dtype="FP16")]
    reports = launch(cheaper.compare_variants, log, variants)     # on 2 gloo ranks: one report per variant
    model = cheaper.train_reference(log)                          # an unsharded fp32 DLRM to serve
    served = cheaper.quantize(model, {"t_user": "INT4", ...})      # torchrec's quantized inference modules
    cheaper.serving_bytes(served)                                 # bytes each table really takes
    flat, deduplicated = cheaper.request_batches(users, items)    # the same requests, each user once (VBE)
    path = cheaper.export_for_serving(served, keys, "m.pt")       # scripted; SERVING_SCRIPT loads it elsewhere

Training variants shard torchrec's DLRM (``models.click_dlrm``) with a hand-written plan, a fused row-wise
Adagrad and, optionally, quantized communication (``QCommsConfig``). Each report holds this rank's bytes of
table weights and of optimizer state, the collectives of one traced training step (``course_lib.trace``),
the time of a step and the test AUC. The serving side goes through
``torchrec.inference.modules.quantize_inference_model``: the embedding tables become fbgemm's inference
kernel (``IntNBitTableBatchedEmbeddingBagsCodegen``), whose rows hold a 4-byte scale and bias (integer types),
then the quantized values, then padding to 16 bytes (the unsharded module's row alignment; the sharded
quantized kernels pad on CUDA only).
"""
from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torchrec import EmbeddingBagConfig, KeyedJaggedTensor

from course_lib import data, models, optimizers, trace, training

__all__ = [
    "SERVING_DTYPES",
    "TABLE_DIM",
    "Variant",
    "as_variable_batch",
    "compare_variants",
    "dedup_lookups",
    "dlrm_tables",
    "export_for_serving",
    "predict",
    "qcomm_registry",
    "quantize",
    "quantize_tables",
    "ranking_requests",
    "request_batches",
    "rowwise_adagrad_sharder",
    "serve_in_another_process",
    "serving_bytes",
    "kernel_bytes",
    "shard_dlrm",
    "table_state",
    "train_reference",
    "train_variant",
    "weight_bytes",
    "wire_bytes",
    "write_requests",
    "ServingModule",
    "SERVING_SCRIPT",
]

TABLE_DIM = 32
# torchrec's quantized inference names precisions by torch dtype (quantize_inference_model's per_table_weight_dtype)
SERVING_DTYPES: dict[str, torch.dtype] = {
    "FP32": torch.float32,
    "FP16": torch.float16,
    "INT8": torch.qint8,
    "INT4": torch.quint4x2,
    "INT2": torch.quint2x4,
}


@dataclass(frozen=True)
class Variant:
    """One way to train the sharded DLRM.

    `table_dtype` is a ``torchrec.modules.embedding_configs.DataType`` name ("FP32", "FP16"); `sharding` is
    "table_wise" or "row_wise"; `comms` is ``(forward, backward)`` ``CommType`` names ("FP16", "BF16") for
    quantized communication, or None; `codec_device` is the device given to ``get_qcomm_codecs_registry``
    ("cpu", or None for none); `compute_kernel` is the plan's kernel ("fused" or "dense").
    """

    name: str
    table_dtype: str = "FP32"
    sharding: str = "table_wise"
    comms: tuple[str, str] | None = None
    codec_device: str | None = "cpu"
    compute_kernel: str = "fused"


def dlrm_tables(config: data.ClickLogConfig, data_type: str = "FP32", dim: int = TABLE_DIM) -> list[EmbeddingBagConfig]:
    """The click log's tables (``t_user``, ``t_item``, ...), `dim` wide, stored as `data_type` ("FP32", "FP16")."""
    from torchrec.modules.embedding_configs import DataType

    return [dataclasses.replace(t, data_type=DataType[data_type]) for t in config.tables(dim)]


def qcomm_registry(forward: str, backward: str, device: str | None = "cpu") -> dict[str, Any] | None:
    """Codecs that quantize the pooled-embedding collectives: `forward` for the forward pass, `backward` for
    the gradients (``CommType`` names: "FP32", "FP16", "BF16", "FP8", "INT8").

    ``get_qcomm_codecs_registry`` takes the device the collectives run on; on "cpu" it replaces BF16 by FP16
    (with a warning only); given no device it assumes "cuda" and keeps BF16.
    """
    from torchrec.distributed.fbgemm_qcomm_codec import CommType, QCommsConfig, get_qcomm_codecs_registry

    config = QCommsConfig(forward_precision=CommType[forward], backward_precision=CommType[backward])
    return get_qcomm_codecs_registry(config, device=torch.device(device) if device is not None else None)


def rowwise_adagrad_sharder(learning_rate: float = 0.1, qcomm_codecs_registry: dict[str, Any] | None = None) -> Any:
    """An EmbeddingBagCollectionSharder with fbgemm's fused exact row-wise Adagrad (one state value per row)."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    return EmbeddingBagCollectionSharder(
        fused_params={"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": learning_rate},
        qcomm_codecs_registry=qcomm_codecs_registry,
    )


def shard_dlrm(config: data.ClickLogConfig, variant: Variant, learning_rate: float = 0.1, seed: int = 0) -> nn.Module:
    """Runs on every rank: the click log's DLRM, its tables in `variant`'s precision, sharded by DMP with a
    hand-written plan (table-wise: table i on rank i % world_size; or row-wise) and `variant`'s kernel."""
    import torch.distributed as dist
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.sharding_plan import row_wise, table_wise
    from torchrec.distributed.types import ShardingPlan

    from course_lib import planning

    world_size = dist.get_world_size()
    registry = qcomm_registry(*variant.comms, device=variant.codec_device) if variant.comms else None
    sharder = rowwise_adagrad_sharder(learning_rate, registry)
    torch.manual_seed(seed)
    tables = dlrm_tables(config, variant.table_dtype)
    model = models.click_dlrm(tables, config.num_dense, device="meta")
    kernel = variant.compute_kernel
    per_table = {
        t.name: table_wise(rank=i % world_size, compute_kernel=kernel)
        if variant.sharding == "table_wise"
        else row_wise(compute_kernel=kernel)
        for i, t in enumerate(tables)
    }
    path = "model.sparse_arch.embedding_bag_collection"
    plan = planning.module_plan(model.get_submodule(path), per_table, world_size=world_size, sharder=sharder)
    return DistributedModelParallel(model, device=training.device(), plan=ShardingPlan({path: plan}), sharders=[sharder])


def weight_bytes(model: nn.Module) -> int:
    """Bytes of embedding-table weights this rank holds (its shards), read off the state dict."""
    return sum(
        optimizers.local_bytes(value) for name, value in model.state_dict().items() if ".embedding_bags." in name
    )


def train_variant(
    log: data.ClickLog, variant: Variant, epochs: int = 1, batch_size: int = 256, learning_rate: float = 0.1
) -> dict[str, Any]:
    """Runs on every rank: shard the DLRM as `variant` says, train it, and measure.

    Returns this rank's ``weight_bytes`` and ``optimizer_bytes`` (the fused optimizer's state, after
    training), ``records`` (the collectives of one extra training step), ``step_ms`` (mean time of a training
    step), ``auc`` (test AUC, all ranks together), ``first_logits`` (the untrained model's logits on this
    rank's first 256 test rows) and ``nan_step`` (the first step whose loss was NaN, or None).
    """
    import torch.distributed as dist

    torch.set_num_threads(1)  # small batches: one thread per rank is faster than two that wait on each other
    rank, world_size = dist.get_rank(), dist.get_world_size()
    model = shard_dlrm(log.config, variant, learning_rate)
    optimizer = training.optimizer(model)
    first = log.test.batch(rank * 256, (rank + 1) * 256).to(training.device())
    model.eval()
    with torch.no_grad():
        _, (_, first_logits, _) = model(first)
    model.train()
    start = time.perf_counter()
    losses = training.train(model, optimizer, log.train, batch_size, epochs=epochs, desc=variant.name)
    step_ms = (time.perf_counter() - start) / len(losses) * 1000
    batch = next(iter(data.batches(log.train, batch_size, rank, world_size))).to(training.device())
    with trace.collectives() as recorded:
        with recorded.phase("forward"):
            loss, _ = model(batch)
        with recorded.phase("backward"):
            loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    nan_step = next((i for i, loss in enumerate(losses) if loss != loss), None)
    auc = training.auc(*training.predict(model, log.test)) if nan_step is None else float("nan")
    return {
        "variant": variant.name,
        "weight_bytes": weight_bytes(model),
        "optimizer_bytes": optimizers.state_bytes(model.fused_optimizer),
        "records": recorded.records,
        "step_ms": step_ms,
        "auc": auc,
        "first_logits": first_logits.float(),
        "nan_step": nan_step,
    }


def wire_bytes(records_by_rank: Sequence[Sequence[trace.Collective]]) -> dict[str, int]:
    """Bytes all ranks handed to collectives in one traced step, by what they carried: "ids" (the input
    all-to-alls: ids, lengths), "embeddings" (pooled embeddings forward, their gradients backward) and
    "dense gradients" (DDP's all-reduce)."""
    found = {"ids": 0, "embeddings": 0, "dense gradients": 0}
    for records in records_by_rank:
        for r in records:
            kind = "dense gradients" if r.op == "all_reduce" else "ids" if "int" in r.dtype else "embeddings"
            found[kind] += r.bytes_in
    return found


def compare_variants(log: data.ClickLog, variants: Sequence[Variant], **kwargs: Any) -> list[dict[str, Any]]:
    """Runs on every rank: :func:`train_variant` for each variant in turn, in one process group."""
    return [train_variant(log, variant, **kwargs) for variant in variants]


# ---------------------------------------------------------------------------- deduplicated batches (VBE)


def ranking_requests(
    num_requests: int, items_per_request: int, num_users: int = 1000, num_items: int = 1000, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Ranking traffic: `num_requests` users, each scored against `items_per_request` random items.
    Returns ``(users [num_requests], items [num_requests * items_per_request])``."""
    g = torch.Generator().manual_seed(seed)
    users = torch.randint(0, num_users, (num_requests,), generator=g)
    return users, torch.randint(0, num_items, (num_requests * items_per_request,), generator=g)


def request_batches(users: torch.Tensor, items: torch.Tensor) -> tuple[Any, Any]:
    """The same requests as two KeyedJaggedTensors with keys ``user`` and ``item``, one id per row:

    - *flat*: one row per (user, item) pair, the user's id repeated in each of its rows;
    - *deduplicated*: each user once (stride ``len(users)``) and each item once (stride ``len(items)``): a
      variable batch per feature (``stride_per_key_per_rank``), with ``inverse_indices`` saying which user row
      and which item row each output row reads.
    """
    from torchrec import KeyedJaggedTensor

    per_request = len(items) // len(users)
    user_rows = torch.arange(len(users)).repeat_interleave(per_request)
    flat = KeyedJaggedTensor(
        keys=["user", "item"], values=torch.cat([users[user_rows], items]), lengths=torch.ones(2 * len(items), dtype=torch.long)
    )
    deduplicated = KeyedJaggedTensor(
        keys=["user", "item"], values=torch.cat([users, items]),
        lengths=torch.ones(len(users) + len(items), dtype=torch.long),
        stride_per_key_per_rank=[[len(users)], [len(items)]],
        inverse_indices=(["user", "item"], torch.stack([user_rows, torch.arange(len(items))])),
    )
    return flat, deduplicated


def as_variable_batch(kjt: Any) -> Any:
    """A KeyedJaggedTensor of one stride, rewritten as a variable-batch one that happens to have the same
    stride for every key (identity ``inverse_indices``): what a sharded module that has taken variable
    batches accepts."""
    from torchrec import KeyedJaggedTensor

    stride, keys = kjt.stride(), kjt.keys()
    return KeyedJaggedTensor(
        keys=keys, values=kjt.values(), lengths=kjt.lengths(), stride_per_key_per_rank=[[stride]] * len(keys),
        inverse_indices=(keys, torch.arange(stride).expand(len(keys), stride).contiguous()),
    )


def dedup_lookups(
    sharding: str, sequences: Sequence[Sequence[str]], num_requests: int = 8, items_per_request: int = 64,
    repeats: int = 20,
) -> list[list[dict[str, Any]]]:
    """Runs on every rank: for each sequence, a fresh sharded EBC with ``t_user`` and ``t_item`` (1,000 x 32
    each, `sharding` "table_wise" or "row_wise", the same weights every time) fed this rank's requests as the
    batches the sequence names, in order: "flat", "deduplicated", or "flat as variable batch"
    (:func:`as_variable_batch`).

    For each batch: ``output`` (the pooled ``[rows, 64]`` values), the bytes its collectives moved on this
    rank (``id_bytes``: ids and lengths; ``embedding_bytes``) and the mean ``ms`` of `repeats` more lookups;
    or ``error``, the first line of what it raised.
    """
    import torch.distributed as dist
    from torchrec import EmbeddingBagCollection
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.sharding_plan import row_wise, table_wise
    from torchrec.distributed.types import ShardingPlan

    from course_lib import planning

    torch.set_num_threads(1)
    world_size = dist.get_world_size()
    tables = [EmbeddingBagConfig(name=f"t_{f}", embedding_dim=32, num_embeddings=1000, feature_names=[f])
              for f in ("user", "item")]
    flat, deduplicated = request_batches(*ranking_requests(num_requests, items_per_request, seed=dist.get_rank()))
    batches = {"flat": flat, "deduplicated": deduplicated, "flat as variable batch": as_variable_batch(flat)}
    results = []
    for sequence in sequences:
        ebc = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
        per_table = {t.name: table_wise(rank=i % world_size, compute_kernel="fused") if sharding == "table_wise"
                     else row_wise(compute_kernel="fused") for i, t in enumerate(tables)}
        plan = ShardingPlan({"": planning.module_plan(ebc, per_table, world_size=world_size)})
        torch.manual_seed(0)
        model = DistributedModelParallel(ebc, device=training.device(), plan=plan)
        found: list[dict[str, Any]] = []
        for kind in sequence:
            batch = batches[kind]
            try:
                with torch.no_grad(), trace.collectives() as recorded:
                    output = model(batch).wait().values().clone()
                start = time.perf_counter()
                with torch.no_grad():
                    for _ in range(repeats):
                        model(batch).wait()
                found.append({
                    "kind": kind, "output": output, "ms": (time.perf_counter() - start) / repeats * 1000,
                    "id_bytes": sum(r.bytes_in for r in recorded.records if "int" in r.dtype),
                    "embedding_bytes": sum(r.bytes_in for r in recorded.records if "int" not in r.dtype),
                })
            except Exception as error:  # noqa: BLE001 - the lab shows what a batch of the wrong kind raises
                text = str(error).strip()
                found.append({"kind": kind, "error": f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"})
            dist.barrier()
        results.append(found)
    return results


# ------------------------------------------------------------------------------------------------ serving


def train_reference(
    log: data.ClickLog, dim: int = TABLE_DIM, epochs: int = 2, batch_size: int = 256, learning_rate: float = 0.01,
    seed: int = 0,
) -> nn.Module:
    """An unsharded fp32 DLRM trained with Adam on `log` (in this process): the model to serve."""
    torch.manual_seed(seed)
    model = models.click_dlrm(log.config.tables(dim), log.config.num_dense)
    training.train(model, torch.optim.Adam(model.parameters(), lr=learning_rate), log.train, batch_size, epochs=epochs,
                   desc=None)
    return model.eval()


def quantize(model: nn.Module, per_table: Mapping[str, str]) -> nn.Module:
    """A quantized copy of `model` for inference: each table in the precision `per_table` names ("FP32",
    "FP16", "INT8", "INT4", "INT2"; see ``SERVING_DTYPES``).

    The copy keeps each row's scale and bias as separate state-dict entries (``weight_qscale``,
    ``weight_qbias``), the layout a model sharded by ``shard_quant_model`` loads.
    """
    from torchrec import EmbeddingBagCollection
    from torchrec.inference.modules import quantize_inference_model
    from torchrec.quant.embedding_modules import quant_prep_enable_quant_state_dict_split_scale_bias_for_types

    unknown = sorted(set(per_table.values()) - set(SERVING_DTYPES))
    if unknown:
        raise ValueError(f"unknown precision {unknown}: choose among {list(SERVING_DTYPES)}")
    copied = copy.deepcopy(model).eval()
    quant_prep_enable_quant_state_dict_split_scale_bias_for_types(copied, [EmbeddingBagCollection])
    return quantize_inference_model(
        copied, per_table_weight_dtype={name: SERVING_DTYPES[p] for name, p in per_table.items()}
    )


def quantize_tables(shapes: Mapping[str, tuple[int, int]], per_table: Mapping[str, str], seed: int = 0) -> nn.Module:
    """Random tables ``{name: (rows, dim)}`` (feature ``name``), quantized as :func:`quantize` does: a quick
    way to see what a precision costs a table of any shape."""
    from torchrec import EmbeddingBagCollection

    torch.manual_seed(seed)
    ebc = EmbeddingBagCollection(tables=[
        EmbeddingBagConfig(name=name, embedding_dim=dim, num_embeddings=rows, feature_names=[name])
        for name, (rows, dim) in shapes.items()
    ])
    return quantize(nn.Sequential(ebc), per_table)


def _kernels(model: nn.Module) -> list[Any]:
    """The fbgemm inference kernels (TBEs) inside a quantized model, sharded or not."""
    from fbgemm_gpu.split_table_batched_embeddings_ops_inference import IntNBitTableBatchedEmbeddingBagsCodegen

    return [m for m in model.modules() if isinstance(m, IntNBitTableBatchedEmbeddingBagsCodegen)]


def serving_bytes(model: nn.Module) -> dict[str, int]:
    """Bytes each table takes in the quantized `model`'s kernels: rows x the padded row (values, scale and
    bias, padding to the kernel's row alignment), as the kernel stores them."""
    found: dict[str, int] = {}
    for kernel in _kernels(model):
        for (name, *_), (rows, _scale, _bias) in zip(kernel.embedding_specs, kernel.split_embedding_weights_with_scale_bias(0)):
            found[name] = found.get(name, 0) + rows.numel() * rows.element_size()
    return found


def kernel_bytes(model: nn.Module) -> int:
    """Bytes of the quantized `model`'s kernel weight buffers: the tables and the padding between them."""
    return sum(max(k.weights_host.numel(), k.weights_dev.numel()) for k in _kernels(model))


def table_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The quantized tables' state (weights, scales, biases) without the kernels' own bookkeeping
    (``.tbes.*``: row counts and offsets, which differ between a sharded model and an unsharded one)."""
    return {name: value for name, value in model.state_dict().items() if ".tbes." not in name}


@torch.no_grad()
def predict(model: nn.Module, split: data.ClickSplit, batch_size: int = 4096) -> tuple[torch.Tensor, float]:
    """Logits of `model` (DLRMTrain, quantized or not, in this process) on `split`, and their AUC."""
    logits = []
    for start in range(0, len(split), batch_size):
        _, (_, batch_logits, _) = model(split.batch(start, min(start + batch_size, len(split))))
        logits.append(batch_logits.float())
    scores = torch.cat(logits)
    return scores, data.auc(scores, split.labels)


# --------------------------------------------------------------------------------- a served artifact

SERVING_SCRIPT = r"""
import json, sys, time
import torch
import fbgemm_gpu  # noqa: F401  registers fbgemm's embedding operators with torch

torch.set_num_threads(1)
artifact, requests, repeats = sys.argv[1], sys.argv[2], int(sys.argv[3])
model = torch.jit.load(artifact)
report = {}
for size, (dense, values, lengths) in torch.load(requests).items():
    with torch.no_grad():
        scores = model(dense, values, lengths)
        for _ in range(5):
            model(dense, values, lengths)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            model(dense, values, lengths)
            times.append(time.perf_counter() - start)
    times.sort()
    report[size] = {"p50_ms": 1000 * times[len(times) // 2], "p99_ms": 1000 * times[min(len(times) - 1, int(len(times) * 0.99))],
                    "rows_per_s": size * repeats / sum(times), "first_scores": scores[:3].tolist()}
print(json.dumps({"modules": sorted(m.split(".")[0] for m in sys.modules if m.startswith(("torchrec", "course_lib"))), "report": report}))
"""


class ServingModule(nn.Module):
    """A DLRM behind plain tensors: ``forward(dense, values, lengths)`` builds the KeyedJaggedTensor itself
    (keys in `keys` order, one length per key and row) and returns click probabilities, so a server needs
    no torchrec object to call it."""

    def __init__(self, dlrm: nn.Module, keys: list[str]) -> None:
        super().__init__()
        self.dlrm = dlrm
        self.keys = keys

    def forward(self, dense: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        features = KeyedJaggedTensor(keys=self.keys, values=values, lengths=lengths)
        return torch.sigmoid(self.dlrm(dense, features)).squeeze(-1)


def export_for_serving(model: nn.Module, keys: Sequence[str], path: str) -> str:
    """Script `model` (a DLRMTrain, fp32 or quantized) for serving: torchrec's FX tracer over its DLRM (which
    leaves the KeyedJaggedTensor's methods as calls), then ``torch.jit.script``; saved to `path`."""
    from torchrec.fx import symbolic_trace

    import warnings

    traced = symbolic_trace(copy.deepcopy(model.model).eval())
    with warnings.catch_warnings():  # fbgemm's quantized dtypes in annotations: scripting treats them as Tensor
        warnings.filterwarnings("ignore", message="TorchScript will treat type annotations")
        torch.jit.script(ServingModule(traced, list(keys))).save(path)
    return path


def artifact_bytes(path: str) -> dict[str, int]:
    """Bytes, uncompressed, of what a ``torch.jit.save`` archive at `path` holds: ``tensors`` (the ``data/``
    records: weights and buffers), ``code`` (the scripted code and the pickled module structure) and
    ``debug`` (the ``.debug_pkl`` source ranges, which record the absolute paths of the source files, so
    their size depends on where Python and its packages are installed; the file's size on disk does too)."""
    import zipfile

    sizes = {"tensors": 0, "code": 0, "debug": 0}
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            name = info.filename.split("/", 1)[-1]
            kind = "debug" if name.endswith(".debug_pkl") else "tensors" if name.startswith("data/") else "code"
            sizes[kind] += info.file_size
    return sizes


def write_requests(split: data.ClickSplit, sizes: Sequence[int], path: str) -> str:
    """One request per batch size, from the start of `split`, as the plain tensors ``ServingModule`` takes."""
    requests = {}
    for size in sizes:
        batch = split.batch(0, size)
        requests[size] = (batch.dense_features, batch.sparse_features.values(), batch.sparse_features.lengths())
    torch.save(requests, path)
    return path


def serve_in_another_process(artifact: str, requests: str, repeats: int = 200) -> dict[str, Any]:
    """Run ``SERVING_SCRIPT`` in a fresh ``python -c`` process (torch and fbgemm_gpu only): it loads the
    artifact, answers each request `repeats` times, and reports latency percentiles, throughput, the first
    scores and which torchrec or course_lib modules it ended up importing."""
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", SERVING_SCRIPT, artifact, requests, str(repeats)],
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])
