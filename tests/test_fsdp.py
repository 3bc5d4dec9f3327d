"""course_lib.fsdp (FSDP2 applied from outside) and the TinyTransformer it shards."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from course_lib import launch
from course_lib.models import TinyTransformer, counting_tokens, next_token_loss

# ------------------------------------------------------------------------------- the model, one process


def test_tiny_transformer_shapes_and_loss():
    torch.manual_seed(0)
    model = TinyTransformer(vocab_size=32, d_model=16, n_heads=2, n_layers=2, max_seq_len=8)
    tokens = counting_tokens(3, 8, vocab_size=32)
    logits = model(tokens)
    assert logits.shape == (3, 8, 32)
    assert len(model.layers) == 2 and isinstance(model.layers, nn.ModuleList)
    loss = next_token_loss(logits, tokens)
    assert loss.shape == () and 2.0 < loss.item() < 6.0  # about log(32) at random init


def test_tiny_transformer_is_causal():
    torch.manual_seed(0)
    model = TinyTransformer(vocab_size=32, d_model=16, n_heads=2, n_layers=2, max_seq_len=8)
    tokens = counting_tokens(1, 8, vocab_size=32)
    changed = tokens.clone()
    changed[0, 5:] = (changed[0, 5:] + 7) % 32
    assert torch.allclose(model(tokens)[:, :5], model(changed)[:, :5], atol=1e-6)
    assert not torch.allclose(model(tokens)[:, 5:], model(changed)[:, 5:])


def test_tiny_transformer_builds_on_meta_and_ties_weights():
    with torch.device("meta"):
        model = TinyTransformer()
    assert all(p.device.type == "meta" for p in model.parameters())
    tied = TinyTransformer(tie_weights=True)
    assert tied.output.weight is tied.tok_embeddings.weight


def test_tiny_transformer_rejects_bad_sizes():
    with pytest.raises(ValueError, match="multiple of n_heads"):
        TinyTransformer(d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="exceeds max_seq_len"):
        TinyTransformer(max_seq_len=4)(counting_tokens(1, 5))


def test_counting_tokens_count_up_and_repeat_with_the_seed():
    tokens = counting_tokens(4, 6, vocab_size=10, seed=3)
    assert torch.equal(tokens, counting_tokens(4, 6, vocab_size=10, seed=3))
    assert torch.equal((tokens[:, 1:] - tokens[:, :-1]) % 10, torch.ones(4, 5, dtype=torch.int64))


def test_a_few_steps_learn_the_counting_task():
    torch.manual_seed(0)
    model = TinyTransformer(vocab_size=32, d_model=32, n_heads=2, n_layers=1, max_seq_len=8)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    tokens = counting_tokens(8, 8, vocab_size=32)
    first = None
    for _ in range(20):
        loss = next_token_loss(model(tokens), tokens)
        first = first if first is not None else loss.item()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < first / 2


def test_parallelize_needs_blocks_when_the_model_has_no_layers():
    from course_lib.fsdp import parallelize

    with pytest.raises(ValueError, match="no `layers` ModuleList"):
        parallelize(nn.Linear(2, 2))


# ------------------------------------------------------------------------------------- on 2 ranks

SMALL = {"vocab_size": 32, "d_model": 16, "n_heads": 2, "n_layers": 2, "max_seq_len": 8}


def _fsdp_facts():
    """Everything the multi-rank tests look at, from one launch (each launch costs a second or two)."""
    import torch
    import torch.distributed as dist

    from course_lib.fsdp import fsdp_groups, full_parameters, is_sharded, parallelize
    from course_lib.models import TinyTransformer, counting_tokens, next_token_loss

    facts = {}
    rank, world_size = dist.get_rank(), dist.get_world_size()
    batch = counting_tokens(4, 8, vocab_size=32)

    # sharded like the lab: groups, DTensors, full_parameters == the unsharded init
    torch.manual_seed(0)
    model = TinyTransformer(**SMALL)
    initial = {name: p.detach().clone() for name, p in model.named_parameters()}
    returned = parallelize(model)
    facts["returns_model"] = returned is model
    facts["groups"] = fsdp_groups(model)
    facts["all_sharded"] = all(is_sharded(p) for p in model.parameters())
    facts["full_is_initial"] = all(torch.equal(full_parameters(model)[n], initial[n]) for n in initial)

    # 3 SGD steps on half the batch each == 3 steps on the whole batch in one process
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    local = batch.chunk(world_size)[rank]
    for _ in range(3):
        next_token_loss(model(local), local).backward()
        optimizer.step()
        optimizer.zero_grad()
    facts["trained"] = full_parameters(model)

    # reshard_after_forward=False leaves the full parameters registered between forward and backward
    torch.manual_seed(0)
    kept = parallelize(TinyTransformer(**SMALL), reshard_after_forward=False)
    loss = next_token_loss(kept(local), local)
    facts["kept_after_forward"] = not any(is_sharded(p) for p in kept.parameters())
    loss.backward()
    facts["sharded_after_backward"] = all(is_sharded(p) for p in kept.parameters())

    # tied weights: one group for both modules
    torch.manual_seed(0)
    tied = TinyTransformer(**SMALL, tie_weights=True)
    parallelize(tied, blocks=[[tied.tok_embeddings, tied.output], *tied.layers])
    next_token_loss(tied(local), local).backward()
    facts["tied_groups"] = fsdp_groups(tied)
    facts["still_tied"] = tied.output.weight is tied.tok_embeddings.weight
    return facts


@pytest.fixture(scope="module")
def facts():
    return launch(_fsdp_facts, world_size=2, show_ranks=[])


def test_parallelize_shards_each_block_then_the_root(facts):
    for rank_facts in facts:
        assert rank_facts["returns_model"]
        assert rank_facts["groups"] == ["", "layers.0", "layers.1"]
        assert rank_facts["all_sharded"]
        assert rank_facts["full_is_initial"]


def test_fsdp_training_equals_one_process_on_the_same_global_batch(facts):
    torch.manual_seed(0)
    model = TinyTransformer(**SMALL)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    batch = counting_tokens(4, 8, vocab_size=32)
    for _ in range(3):
        next_token_loss(model(batch), batch).backward()
        optimizer.step()
        optimizer.zero_grad()
    for rank_facts in facts:
        for name, param in model.named_parameters():
            assert torch.allclose(rank_facts["trained"][name], param.detach(), atol=1e-5), name


def test_reshard_after_forward_false_keeps_full_parameters_until_backward(facts):
    assert all(f["kept_after_forward"] and f["sharded_after_backward"] for f in facts)


def test_tied_modules_share_one_group(facts):
    for rank_facts in facts:
        assert rank_facts["tied_groups"] == ["", "tok_embeddings", "layers.0", "layers.1", "output"]
        assert rank_facts["still_tied"]
