"""The one place where library warnings that teach a learner nothing are silenced.

Notebooks call :func:`install` (``course_lib.notebook_setup()`` does it) and every launched rank calls it
before running the learner's function, so a cell shows the lab's output, not FutureWarnings from torchrec
internals. Warnings a learner should act on are left alone: only messages listed here are filtered.
"""
from __future__ import annotations

import logging
import warnings

# (message regex, category, module regex) — each entry says why it is noise.
_FILTERS: list[tuple[str, type[Warning], str]] = [
    # torchrec's own modules use deprecated torch APIs; nothing for a learner to change.
    (r".*", FutureWarning, r"torchrec(\..*)?"),
    (r".*", DeprecationWarning, r"torchrec(\..*)?"),
    (r".*", UserWarning, r"torchrec\.distributed\.(planner|embedding_sharding|types)(\..*)?"),
    # torchmetrics 1.0.3 (the version torchrec 1.8 declares) compares versions with distutils on import.
    (r"distutils Version classes are deprecated.*", DeprecationWarning, r"torchmetrics(\..*)?"),
    # torchrec's quantized inference modules (lab 11) call torch.ao.quantization, which torch marks deprecated.
    (r"torch\.ao\.quantization is deprecated.*", DeprecationWarning, r""),
    # fbgemm_gpu announces optional kernels that the CPU build lacks.
    (r".*", UserWarning, r"fbgemm_gpu(\..*)?"),
    # TypedStorage deprecation surfaces through torch internals in ShardedTensor code.
    (r"TypedStorage is deprecated.*", UserWarning, r""),
    # torch.distributed prints this when a process group is torn down by the launcher, as it should be.
    (r".*destroy_process_group\(\) was not called.*", UserWarning, r""),
    # torch.distributed._shard deprecation notices emitted by torchrec's use of ShardedTensor.
    (r".*torch\.distributed\._shard.*deprecated.*", FutureWarning, r""),
    # torch.distributed.checkpoint (and torch.save, through torch.overrides) note, on every save and load of a
    # DMP model, that ShardedTensor (what torchrec's sharded tables are) will give way to DTensor; nothing for a
    # learner to change.
    (r"Please use DTensor instead and we are deprecating ShardedTensor", FutureWarning,
     r"torch\.(distributed\.checkpoint(\..*)?|overrides)"),
    # The same note on every state_dict() of a DMP model, attributed to whichever code called state_dict().
    (r"Please use DTensor instead and we are deprecating ShardedTensor", FutureWarning, r""),
    # torchrec's row-wise sharding calls these c10d functions (deprecated in favour of *_single) internally.
    (r"`torch\.distributed\.(reduce_scatter_tensor|all_gather_into_tensor)` is deprecated.*", FutureWarning,
     r"torch\.distributed\.c10d_logger"),
    # fbgemm's dense (data-parallel) embedding kernel: torch asks fbgemm to register an autograd kernel.
    (r"fbgemm::dense_embedding_codegen_lookup_function: an autograd kernel was not registered.*", UserWarning,
     r"torch\.autograd(\..*)?"),
    # FSDP2 warns when a sharded module returns a view (a Linear on a 3-D input does) in case the caller then
    # modifies it in place; the labs' models never do.
    (r"FSDP2-wrapped module \(.*\) returned a view tensor.*", UserWarning,
     r"torch\.distributed\.fsdp\._fully_shard\._fsdp_state"),
    # nn.Transformer(...) with the default batch_first=False: a note about an inference fast path.
    (r"enable_nested_tensor is True, but self\.use_nested_tensor is False.*", UserWarning,
     r"torch\.nn\.modules\.transformer"),
    # torchrec's BinaryCriteoUtils.tsv_to_npys maps rows with a local function; torch's DataPipes note that
    # such a pipe cannot be pickled, which nothing here does.
    (r"Local function is not supported by pickle.*", UserWarning, r"torch\.utils\.data\.datapipes(\..*)?"),
    # init_process_group(backend="nccl") on a CPU build warns before it raises "doesn't have NCCL built in".
    (r"Attempted to get default timeout for nccl backend, but NCCL support is not compiled", UserWarning,
     r"torch\.distributed\.distributed_c10d"),
    # reset_parameters() on DTensor shards of a CPU mesh (lab 06's meta-device init): torch notes that its DTensor
    # random ops "may not have complete support" on CPU; lab 06 and its check show the replicas start equal.
    (r"DTensor random operators may not have complete support on cpu device mesh", UserWarning,
     r"torch\.distributed\.tensor\._dispatch"),
]

# torch.fx._symbolic_trace: torchrec's KJT/EBC code calls torch.fx's is_fx_tracing(), which logs a deprecation
# note (with a timestamp and pid) on first use in every process.
_LOGGERS_TO_QUIET = ("torchrec", "fbgemm_gpu", "torch.distributed.elastic", "torch.fx._symbolic_trace")


def install() -> None:
    """Filter the known noisy warnings and quiet chatty library loggers (idempotent)."""
    for message, category, module in _FILTERS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    for name in _LOGGERS_TO_QUIET:
        logging.getLogger(name).setLevel(logging.ERROR)
