"""The 06_fsdp checks accept the solutions and reject plausible wrong answers."""
from __future__ import annotations

import pytest
import torch

from course_lib.checks import CheckFailed
from course_lib.checks import lab06


# ------------------------------------------------------------------------------------- shard
# Functions shipped to the ranks import what they use, so cloudpickle sends them by value.


def shard_solution(model):
    from torch.distributed.fsdp import fully_shard

    for block in model.layers:
        fully_shard(block)
    fully_shard(model)


def shard_nothing(model):
    return model


def shard_root_only(model):
    from torch.distributed.fsdp import fully_shard

    fully_shard(model)


def shard_blocks_only(model):
    from torch.distributed.fsdp import fully_shard

    for block in model.layers:
        fully_shard(block)


def shard_root_first(model):
    from torch.distributed.fsdp import fully_shard

    fully_shard(model)
    for block in model.layers:
        fully_shard(block)


def shard_with_ddp(model):
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model)


def shard_resharding_the_root_too(model):  # not a mistake: the root gathers once more in backward
    from torch.distributed.fsdp import fully_shard

    for block in model.layers:
        fully_shard(block)
    fully_shard(model, reshard_after_forward=True)


def test_shard_check_accepts_a_root_that_reshards(capsys):
    lab06.check_shard(shard_resharding_the_root_too)
    assert capsys.readouterr().out.startswith("✓")


def shard_like_torchtitan(model):  # not a mistake: the last block keeps its parameters for the backward
    from torch.distributed.fsdp import fully_shard

    for i, block in enumerate(model.layers):
        fully_shard(block, reshard_after_forward=i < len(model.layers) - 1)
    fully_shard(model)


def test_shard_check_accepts_the_last_block_kept_whole_as_torchtitan_does(capsys):
    lab06.check_shard(shard_like_torchtitan)
    assert capsys.readouterr().out.startswith("✓")


def shard_a_copy(model):
    import copy

    from torch.distributed.fsdp import fully_shard

    model = copy.deepcopy(model)
    for block in model.layers:
        fully_shard(block)
    fully_shard(model)
    return model


def shard_without_resharding(model):
    from torch.distributed.fsdp import fully_shard

    for block in model.layers:
        fully_shard(block, reshard_after_forward=False)
    fully_shard(model)


def shard_the_embedding_too(model):
    from torch.distributed.fsdp import fully_shard

    fully_shard(model.tok_embeddings)
    for block in model.layers:
        fully_shard(block)
    fully_shard(model)


def shard_every_linear(model):
    from torch.distributed.fsdp import fully_shard

    for module in list(model.modules()):
        if isinstance(module, torch.nn.Linear):
            fully_shard(module)
    fully_shard(model)


def shard_the_blocks_as_one_group(model):  # fully_shard of a list: one group, one all-gather for every block
    from torch.distributed.fsdp import fully_shard

    fully_shard(list(model.layers))
    fully_shard(model)


def not_written(model):
    raise NotImplementedError()


def test_shard_check_accepts_the_solution(capsys):
    lab06.check_shard(shard_solution)
    out = capsys.readouterr().out
    assert out.startswith("✓") and "4 all-gathers per forward" in out


@pytest.mark.parametrize(
    "wrong, words",
    [
        (shard_nothing, "no parameter is sharded"),
        (shard_root_only, "only the root was sharded"),
        (shard_blocks_only, "the root is not sharded"),
        (shard_root_first, "bottom-up|not a group"),
        (shard_with_ddp, "no parameter is sharded"),
        (shard_a_copy, "returned another module"),
        (shard_without_resharding, "reshard_after_forward"),
        (shard_the_embedding_too, "of its own besides the blocks"),
        (shard_every_linear, "are groups of its own besides"),
        (shard_the_blocks_as_one_group, "layers.0, layers.1, layers.2 are one FSDP group"),
        (not_written, "not written yet"),
    ],
)
def test_shard_check_rejects_wrong_answers(wrong, words):
    with pytest.raises(CheckFailed, match=words):
        lab06.check_shard(wrong)


# ------------------------------------------------------------------------------------- bytes


def predict_solution(num_params, world_size):
    return {"params": 4 * num_params / world_size, "grads": 4 * num_params / world_size,
            "optimizer": 8 * num_params / world_size}


def predict_ddp(num_params, world_size):
    return {"params": 4 * num_params, "grads": 4 * num_params, "optimizer": 8 * num_params}


def predict_one_adam_state(num_params, world_size):
    return {**predict_solution(num_params, world_size), "optimizer": 4 * num_params / world_size}


def predict_master_copy(num_params, world_size):
    return {**predict_solution(num_params, world_size), "optimizer": 12 * num_params / world_size}


def predict_zero2(num_params, world_size):  # parameters left whole
    return {**predict_solution(num_params, world_size), "params": 4 * num_params}


def predict_count_not_bytes(num_params, world_size):
    return {"params": num_params / world_size, "grads": num_params / world_size,
            "optimizer": 2 * num_params / world_size}


def predict_zero1(num_params, world_size):  # only the optimizer state sharded
    return {**predict_solution(num_params, world_size), "params": 4 * num_params, "grads": 4 * num_params}


def predict_no_grads(num_params, world_size):  # "gradients are freed after the step"
    return {**predict_solution(num_params, world_size), "grads": 0}


def predict_for_two_ranks(num_params, world_size):  # world_size typed in
    return predict_solution(num_params, 2)


def predict_bf16(num_params, world_size):  # 2 bytes a parameter and a gradient
    return {**predict_solution(num_params, world_size), "params": 2 * num_params / world_size,
            "grads": 2 * num_params / world_size}


def test_bytes_check_accepts_the_solution(capsys):
    lab06.check_bytes_prediction(predict_solution)
    assert capsys.readouterr().out.startswith("✓")


def test_bytes_check_accepts_numpy_numbers(capsys):
    import numpy as np

    lab06.check_bytes_prediction(lambda n, w: {k: np.float32(v) for k, v in predict_solution(n, w).items()})
    assert capsys.readouterr().out.startswith("✓")


@pytest.mark.parametrize(
    "wrong, words",
    [
        (predict_ddp, "under DDP"),
        (predict_one_adam_state, "two fp32 tensors"),
        (predict_master_copy, "no fp32 master copy"),
        (predict_zero2, "under DDP"),
        (predict_count_not_bytes, "counts values, not bytes"),
        (predict_zero1, "under DDP"),
        (predict_no_grads, "grads"),
        (predict_for_two_ranks, "on 4 ranks"),
        (predict_bf16, "fp32 \\(4 bytes a value\\), not bf16"),
        (lambda n, w: [1, 2, 3], "return a dict"),
        (lambda n, w: {"params": "4N", "grads": 0, "optimizer": 0}, "number of bytes"),
    ],
)
def test_bytes_check_rejects_wrong_answers(wrong, words):
    with pytest.raises(CheckFailed, match=words):
        lab06.check_bytes_prediction(wrong)


def test_the_bytes_model_divides_evenly_on_four_ranks():
    num_params, measured = lab06.measured_bytes(4)
    assert measured == {"params": num_params, "grads": num_params, "optimizer": 2 * num_params,
                        "total": 4 * num_params}


def test_bytes_check_says_when_the_answer_is_not_written():
    def predict(num_params, world_size):
        raise NotImplementedError()

    with pytest.raises(CheckFailed, match="not written yet"):
        lab06.check_bytes_prediction(predict)


# ------------------------------------------------------------------------------------------ hsdp


def hsdp_mesh():
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))


def reset_every_module(model):
    for module in model.modules():
        if hasattr(module, "reset_parameters"):
            module.reset_parameters()
        elif isinstance(module, torch.nn.MultiheadAttention):
            module._reset_parameters()


def shard_bottom_up(model, block_mesh, root_mesh):
    """fully_shard each block on `block_mesh` (None: the default mesh over every rank), then the root."""
    from torch.distributed.fsdp import fully_shard

    for block in model.layers:
        fully_shard(block, mesh=block_mesh)
    fully_shard(model, mesh=root_mesh)


def build_hsdp(mesh, *, materialize=True, reset=reset_every_module, blocks=True, shard_mesh=None):
    from torch.distributed.fsdp import fully_shard

    from course_lib.models import TinyTransformer

    torch.manual_seed(0)
    model = TinyTransformer(**lab06.HSDP_MODEL, device="meta")
    if blocks:
        shard_bottom_up(model, shard_mesh or mesh, shard_mesh or mesh)
    else:
        fully_shard(model, mesh=shard_mesh or mesh)
    if materialize:
        model.to_empty(device="cpu")
        if reset is not None:
            reset(model)
    return model


def flat_mesh():
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (4,))


def shard_across_hosts_mesh():  # ranks 0 and 2 share a shard group: each group spans both hosts
    from torch.distributed.device_mesh import DeviceMesh

    return DeviceMesh("cpu", torch.tensor([[0, 2], [1, 3]]), mesh_dim_names=("replicate", "shard"))


def unnamed_mesh():
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (2, 2))


def four_replicas_mesh():
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (4, 1), mesh_dim_names=("replicate", "shard"))


def reset_all_but_attention(model):
    for module in model.modules():
        if hasattr(module, "reset_parameters"):
            module.reset_parameters()


def build_without_reset(mesh):
    model = build_hsdp(mesh, reset=None)
    with torch.no_grad():  # to_empty's memory is often zeros; make that certain
        for p in model.parameters():
            p.to_local().zero_()
    return model


def build_whole_on_the_cpu(mesh):  # the model allocated whole on every rank, then sharded
    from course_lib.models import TinyTransformer

    torch.manual_seed(0)
    model = TinyTransformer(**lab06.HSDP_MODEL)
    shard_bottom_up(model, mesh, mesh)
    return model


def build_on_the_cpu_then_reset(mesh):  # the lab's steps after sharding, but the model was built whole first
    model = build_whole_on_the_cpu(mesh)
    model.to_empty(device="cpu")
    reset_every_module(model)
    return model


def build_materialized_before_sharding(mesh):  # on meta, but to_empty before fully_shard: whole on every rank
    from course_lib.models import TinyTransformer

    torch.manual_seed(0)
    model = TinyTransformer(**lab06.HSDP_MODEL, device="meta")
    model.to_empty(device="cpu")
    reset_every_module(model)
    shard_bottom_up(model, mesh, mesh)
    return model


def build_seeded_by_rank(mesh):  # each rank its own seed: the replicas start apart
    import torch.distributed as dist

    from course_lib.models import TinyTransformer

    torch.manual_seed(dist.get_rank())
    model = TinyTransformer(**lab06.HSDP_MODEL, device="meta")
    shard_bottom_up(model, mesh, mesh)
    model.to_empty(device="cpu")
    reset_every_module(model)
    return model


def build_with_meta_context(mesh):  # meta through torch.device("meta"): right too
    from course_lib.models import TinyTransformer

    torch.manual_seed(0)
    with torch.device("meta"):
        model = TinyTransformer(**lab06.HSDP_MODEL)
    shard_bottom_up(model, mesh, mesh)
    model.to_empty(device="cpu")
    reset_every_module(model)
    return model


def test_hsdp_check_accepts_a_model_built_in_a_meta_device_context(capsys):
    lab06.check_hsdp(hsdp_mesh, build_with_meta_context)
    assert capsys.readouterr().out.startswith("✓")


def build_blocks_on_the_default_mesh(mesh):  # the blocks sharded over all 4 ranks, the root over the 2-D mesh
    from course_lib.models import TinyTransformer

    torch.manual_seed(0)
    model = TinyTransformer(**lab06.HSDP_MODEL, device="meta")
    shard_bottom_up(model, None, mesh)
    model.to_empty(device="cpu")
    reset_every_module(model)
    return model


def test_hsdp_check_accepts_the_solution(capsys):
    lab06.check_hsdp(hsdp_mesh, build_hsdp)
    assert capsys.readouterr().out.startswith("✓")


@pytest.mark.parametrize(
    "mesh, build, words",
    [
        (flat_mesh, build_hsdp, "1-D mesh is plain FSDP"),
        (shard_across_hosts_mesh, build_hsdp, "shards span hosts"),
        (four_replicas_mesh, build_hsdp, "shape \\(4, 1\\)"),
        (unnamed_mesh, build_hsdp, "mesh_dim_names"),
        (hsdp_mesh, lambda mesh: build_hsdp(mesh, materialize=False), "never materialized"),
        (hsdp_mesh, build_without_reset, "not initialized"),
        (hsdp_mesh, lambda mesh: build_hsdp(mesh, reset=reset_all_but_attention), "in_proj_weight"),
        (hsdp_mesh, lambda mesh: build_hsdp(mesh, shard_mesh=mesh["shard"]), "Shard\\(dim=0\\),\\) ?, HSDP|placed"),
        (hsdp_mesh, lambda mesh: build_hsdp(mesh, blocks=False), "one per block and the root"),
        (hsdp_mesh, lambda mesh: None, "returned a NoneType"),
        (hsdp_mesh, build_whole_on_the_cpu, "built the TinyTransformer on cpu"),
        (hsdp_mesh, build_on_the_cpu_then_reset, "built the TinyTransformer on cpu"),
        (hsdp_mesh, build_seeded_by_rank, "the ranks start from different weights"),
        (hsdp_mesh, build_materialized_before_sharding, "called to_empty before fully_shard"),
        (hsdp_mesh, build_blocks_on_the_default_mesh,
         "placed \\(Replicate\\(\\), Shard\\(dim=0\\)\\), \\(Shard\\(dim=0\\),\\)"),
    ],
)
def test_hsdp_check_rejects_wrong_answers(mesh, build, words):
    with pytest.raises(CheckFailed, match=words):
        lab06.check_hsdp(mesh, build)
