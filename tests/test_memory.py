"""course_lib.memory: bytes per rank, measured from the tensors, and the ZeRO formula."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from course_lib import memory


def adam_step(model: nn.Module, **adam) -> torch.optim.Optimizer:
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, **adam)
    model(torch.randn(2, model[0].in_features)).sum().backward()
    optimizer.step()
    return optimizer


def mlp(dtype=torch.float32) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2)).to(dtype)  # 46 parameters


def test_plain_module_counts_every_tensor_in_full():
    model = mlp()
    assert memory.count_params(model) == 46
    assert memory.param_bytes(model) == 46 * 4
    assert memory.grad_bytes(model) == 0  # no backward yet
    optimizer = adam_step(model)
    assert memory.measure(model, optimizer) == memory.RankMemory(params=184, grads=184, optimizer=368)
    assert memory.measure(model, optimizer).as_dict() == {"params": 184, "grads": 184, "optimizer": 368, "total": 736}


def test_element_size_follows_the_dtype():
    assert memory.param_bytes(mlp(torch.bfloat16)) == 46 * 2
    assert memory.tensor_bytes(torch.zeros(3, 5, dtype=torch.float64)) == 120


def test_adam_step_counters_are_left_out_unless_asked():
    model = mlp()
    optimizer = adam_step(model)
    assert memory.optimizer_state_bytes(optimizer) == 2 * 46 * 4
    tensors = len(list(model.parameters()))  # one 4-byte fp32 step scalar each
    assert memory.optimizer_state_bytes(optimizer, include_step=True) == 2 * 46 * 4 + 4 * tensors


def test_optimizer_state_depends_on_the_optimizer():
    model = mlp()
    plain_sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    momentum = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 8)).sum().backward()
    plain_sgd.step()
    momentum.step()
    assert memory.optimizer_state_bytes(plain_sgd) == 0
    assert memory.optimizer_state_bytes(momentum) == 46 * 4


def test_tied_parameters_count_once():
    model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 10, bias=False))
    model[1].weight = model[0].weight
    assert memory.count_params(model) == 40
    assert memory.param_bytes(model) == 160


def test_count_params_on_meta_allocates_nothing():
    with torch.device("meta"):
        big = nn.Linear(100_000, 100_000)
    assert memory.count_params(big) == 100_000 * 100_000 + 100_000


def test_zero_formula_in_fp32_with_adam():
    psi = 1000
    assert memory.zero_bytes(psi, 4, 0) == memory.RankMemory(4000, 4000, 8000)
    assert memory.zero_bytes(psi, 4, 1) == memory.RankMemory(4000, 4000, 2000)
    assert memory.zero_bytes(psi, 4, 2) == memory.RankMemory(4000, 1000, 2000)
    assert memory.zero_bytes(psi, 4, 3) == memory.RankMemory(1000, 1000, 2000)
    assert memory.zero_bytes(psi, 1, 3) == memory.zero_bytes(psi, 1, 0)
    assert memory.zero_bytes(10, 4, 3).params == 10  # 40 bytes / 4 ranks
    assert memory.zero_bytes(10, 3, 3).params == 14  # shards round up


def test_zero_formula_reproduces_the_papers_figure_1():
    # Rajbhandari et al. 2020, Figure 1: 7.5B parameters, 64 GPUs, mixed-precision Adam (K = 12).
    def gb(stage):
        return memory.zero_bytes(7_500_000_000, 64, stage, **memory.MIXED_PRECISION_ADAM).total / 1e9

    assert gb(0) == pytest.approx(120)
    assert gb(1) == pytest.approx(31.4, abs=0.05)
    assert gb(2) == pytest.approx(16.6, abs=0.05)
    assert gb(3) == pytest.approx(1.88, abs=0.005)


@pytest.mark.parametrize("kwargs, words", [({"stage": 4}, "stage must be"), ({"stage": 3, "world_size": 0}, "at least 1")])
def test_zero_formula_rejects_bad_arguments(kwargs, words):
    with pytest.raises(ValueError, match=words):
        memory.zero_bytes(100, **{"world_size": 2, **kwargs})


@pytest.mark.parametrize(
    "n, text",
    [(0, "0 B"), (1023, "1023 B"), (1024, "1 KiB"), (1536, "1.5 KiB"), (947_712, "926 KiB"), (1_048_000, "1023 KiB"),
     (1_048_100, "1 MiB"), (3 * 2**30, "3 GiB"), (5 * 2**50, "5120 TiB")],
)
def test_format_bytes(n, text):
    assert memory.format_bytes(n) == text


def _measure_ddp_and_fsdp():
    import torch
    from torch.nn.parallel import DistributedDataParallel

    from course_lib import memory
    from course_lib.fsdp import parallelize

    out = {}
    for wrapper in ("DDP", "FSDP"):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2))
        model = DistributedDataParallel(model) if wrapper == "DDP" else parallelize(model, blocks=[model[0]])
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        model(torch.randn(2, 8)).sum().backward()
        optimizer.step()
        out[wrapper] = (memory.measure(model, optimizer), memory.count_params(model))
    return out


def test_ddp_holds_everything_and_fsdp_its_shards():
    from course_lib import launch

    per_rank = launch(_measure_ddp_and_fsdp, world_size=2, show_ranks=[])
    for rank_result in per_rank:
        assert rank_result["DDP"] == (memory.RankMemory(184, 184, 368), 46)
        # FSDP2 chunks each parameter's rows: (4, 8) -> 2 rows each; (2, 4) -> 1 row each; 46 / 2 = 23 values.
        assert rank_result["FSDP"] == (memory.RankMemory(92, 92, 184), 46)
