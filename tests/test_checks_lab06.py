"""The 06_fsdp checks accept the solutions and reject plausible wrong answers."""
from __future__ import annotations

import pytest
import torch

from course_lib.checks import CheckFailed
from course_lib.checks import lab06
from course_lib.models import TinyTransformer


# ------------------------------------------------------------------------------------- shard
# Functions shipped to the ranks import what they use, so cloudpickle sends them by value.


def shard_solution(model):
    from torch.distributed.fsdp import fully_shard

    for block in [*model.encoder, *model.decoder]:
        fully_shard(block)
    fully_shard([model.shared, model.lm_head])
    fully_shard(model)


def shard_tied_pair_left_to_the_root(model):  # not a mistake: the root's group holds the tied matrix
    from torch.distributed.fsdp import fully_shard

    for block in [*model.encoder, *model.decoder]:
        fully_shard(block)
    fully_shard(model)


def shard_with_parallelize(model):  # not a mistake: parallelize with its blocks named
    from course_lib.fsdp import parallelize

    parallelize(model, [*model.encoder, *model.decoder, [model.shared, model.lm_head]])


def shard_like_torchtitan(model):  # not a mistake: the last block keeps its parameters for the backward
    from torch.distributed.fsdp import fully_shard

    blocks = [*model.encoder, *model.decoder]
    for i, block in enumerate(blocks):
        fully_shard(block, reshard_after_forward=i < len(blocks) - 1)
    fully_shard(model)


@pytest.mark.parametrize("answer", [shard_tied_pair_left_to_the_root, shard_with_parallelize, shard_like_torchtitan])
def test_shard_check_accepts_other_right_answers(answer, capsys):
    lab06.check_shard(answer)
    assert capsys.readouterr().out.startswith("✓")


def shard_nothing(model):
    return model


def shard_as_in_the_lab(model):  # section 2's loop, on a model without `.layers`
    from torch.distributed.fsdp import fully_shard

    for block in model.layers:
        fully_shard(block)
    fully_shard(model)


def shard_with_parallelize_defaults(model):
    from course_lib.fsdp import parallelize

    parallelize(model)


def shard_root_only(model):
    from torch.distributed.fsdp import fully_shard

    fully_shard(model)


def shard_the_encoder_only(model):  # the decoder's blocks left to the root
    from torch.distributed.fsdp import fully_shard

    for block in model.encoder:
        fully_shard(block)
    fully_shard(model)


def shard_the_lists(model):  # one group per list, not per block
    from torch.distributed.fsdp import fully_shard

    fully_shard(model.encoder)
    fully_shard(model.decoder)
    fully_shard(model)


def shard_the_tied_pair_apart(model):  # the lab's tied-weight mistake
    from torch.distributed.fsdp import fully_shard

    for block in [*model.encoder, *model.decoder]:
        fully_shard(block)
    fully_shard(model.shared)
    fully_shard(model.lm_head)
    fully_shard(model)


def shard_the_head_alone(model):  # the output head a group, the embedding left to the root
    from torch.distributed.fsdp import fully_shard

    for block in [*model.encoder, *model.decoder]:
        fully_shard(block)
    fully_shard(model.lm_head)
    fully_shard(model)


def shard_after_untying(model):  # dodges FSDP's error by giving the head a copy
    import torch
    from torch.distributed.fsdp import fully_shard

    model.lm_head.weight = torch.nn.Parameter(model.shared.weight.detach().clone())
    for block in [*model.encoder, *model.decoder]:
        fully_shard(block)
    fully_shard(model.shared)
    fully_shard(model.lm_head)
    fully_shard(model)


def shard_the_pair_with_a_block(model):  # the tied pair and a block as one group
    from torch.distributed.fsdp import fully_shard

    for block in [*model.encoder, *model.decoder[1:]]:
        fully_shard(block)
    fully_shard([model.shared, model.lm_head, model.decoder[0]])
    fully_shard(model)


def shard_root_first(model):
    from torch.distributed.fsdp import fully_shard

    fully_shard(model)
    for block in [*model.encoder, *model.decoder]:
        fully_shard(block)


def shard_blocks_only(model):
    from torch.distributed.fsdp import fully_shard

    for block in [*model.encoder, *model.decoder]:
        fully_shard(block)
    fully_shard([model.shared, model.lm_head])


def shard_without_resharding(model):
    from torch.distributed.fsdp import fully_shard

    for block in [*model.encoder, *model.decoder]:
        fully_shard(block, reshard_after_forward=False)
    fully_shard(model)


def shard_a_copy(model):
    import copy

    from torch.distributed.fsdp import fully_shard

    model = copy.deepcopy(model)
    for block in [*model.encoder, *model.decoder]:
        fully_shard(block)
    fully_shard(model)
    return model


def not_written(model):
    raise NotImplementedError()


def test_shard_check_accepts_the_solution(capsys):
    lab06.check_shard(shard_solution)
    out = capsys.readouterr().out
    assert out.startswith("✓") and "7 all-gathers per forward (the shared matrix once" in out


@pytest.mark.parametrize(
    "wrong, words",
    [
        (shard_nothing, "no parameter is sharded"),
        (shard_as_in_the_lab, "this model has no `layers`"),
        (shard_with_parallelize_defaults, "this model has no `layers`"),
        (shard_root_only, "only the root was sharded"),
        (shard_the_encoder_only, "decoder.0, decoder.1, decoder.2 are not a group of its own"),
        (shard_the_lists, "fully_shard refused a ModuleList"),
        (shard_the_tied_pair_apart, "one matrix, and it is split: shared and lm_head are two groups"),
        (shard_the_head_alone, "it is split: lm_head is a group and shared is left to the root"),
        (shard_after_untying, "lm_head.weight is no longer shared.weight"),
        (shard_the_pair_with_a_block, "shared, decoder.0, lm_head are one FSDP group"),
        (shard_root_first, "bottom-up|not a group"),
        (shard_blocks_only, "the root is not sharded"),
        (shard_without_resharding, "reshard_after_forward=False"),
        (shard_a_copy, "returned another module"),
        (not_written, "not written yet"),
    ],
)
def test_shard_check_rejects_wrong_answers(wrong, words):
    with pytest.raises(CheckFailed, match=words):
        lab06.check_shard(wrong)


# ------------------------------------------------------------------------------------- bytes


def predict_solution(num_params, world_size, reshard_after_forward, param_dtype):
    return {"sharded params": 4 * num_params / world_size,
            "full params": 0 if reshard_after_forward else param_dtype.itemsize * num_params,
            "grads": 0, "optimizer": 8 * num_params / world_size}


def with_(key, value):  # the solution with one entry replaced by value(num_params, world_size, reshard, dtype)
    def predict(n, w, reshard, dtype):
        return {**predict_solution(n, w, reshard, dtype), key: value(n, w, reshard, dtype)}
    return predict


def predict_after_the_step(num_params, world_size, reshard_after_forward, param_dtype):  # the lab's formula
    return {"sharded params": 4 * num_params / world_size, "full params": 0,
            "grads": 4 * num_params / world_size, "optimizer": 8 * num_params / world_size}


def predict_ddp(num_params, world_size, reshard_after_forward, param_dtype):
    return {"sharded params": 4 * num_params, "full params": 0, "grads": 0, "optimizer": 8 * num_params}


def predict_for_two_ranks(num_params, world_size, reshard_after_forward, param_dtype):  # world_size typed in
    return predict_solution(num_params, 2, reshard_after_forward, param_dtype)


def test_bytes_check_accepts_the_solution(capsys):
    lab06.check_bytes_prediction(predict_solution)
    out = capsys.readouterr().out
    assert out.startswith("✓") and "in all 4 settings" in out


def test_bytes_check_accepts_numpy_numbers(capsys):
    import numpy as np

    lab06.check_bytes_prediction(lambda *a: {k: np.float32(v) for k, v in predict_solution(*a).items()})
    assert capsys.readouterr().out.startswith("✓")


@pytest.mark.parametrize(
    "wrong, words",
    [
        (predict_after_the_step, "(?s)full params=0 bytes .* reshard_after_forward=False keeps each group's full"),
        (with_("grads", lambda n, w, r, d: 4 * n / w), "zero_grad\\(\\) sets every gradient to None"),
        (with_("full params", lambda n, w, r, d: 0 if r else 4 * n), "param_dtype=torch.bfloat16: the all-gather casts"),
        (with_("full params", lambda n, w, r, d: 0 if r else d.itemsize * n / w), "whole on every rank"),
        (with_("full params", lambda n, w, r, d: d.itemsize * n), "reshard_after_forward=True on every group, the root too"),
        (with_("full params", lambda n, w, r, d: 0 if r else (d.itemsize + 4) * n), "count the shards under"),
        (with_("sharded params", lambda n, w, r, d: d.itemsize * n / w), "the shards stay fp32"),
        (with_("sharded params", lambda n, w, r, d: 4 * n / w if r else 0), "FSDP keeps the shards"),
        (with_("optimizer", lambda n, w, r, d: 4 * n / w), "two fp32 tensors"),
        (predict_ddp, "1/world_size"),
        (with_("full params", lambda n, w, r, d: 0 if r else d.itemsize * n / 4), "counts values, not bytes"),
        (predict_for_two_ranks, "on 4 ranks"),
        (lambda n, w, r, d: [1, 2, 3], "return a dict"),
        (lambda n, w, r, d: {**predict_solution(n, w, r, d), "grads": "0"}, "number of bytes"),
        (lambda n, w, r, d: predict_solution(n, w, r, 2), "raised AttributeError"),
    ],
)
def test_bytes_check_rejects_wrong_answers(wrong, words):
    with pytest.raises(CheckFailed, match=words):
        lab06.check_bytes_prediction(wrong)


def test_the_bytes_model_divides_evenly_on_four_ranks():
    num_params, measured = lab06.measured_bytes(4)
    assert measured[(False, "bfloat16")] == {"sharded params": num_params, "full params": 2 * num_params, "grads": 0,
                                             "optimizer": 2 * num_params}
    assert measured[(True, "float32")]["full params"] == 0


def test_bytes_check_says_when_the_answer_is_not_written():
    def predict(num_params, world_size, reshard_after_forward, param_dtype):
        raise NotImplementedError()

    with pytest.raises(CheckFailed, match="not written yet"):
        lab06.check_bytes_prediction(predict)


# ---------------------------------------------------------------------------------- layout decision


def predict_state(num_params, shards):  # model state at rest: 16 bytes per parameter / shards
    return 16 * num_params / shards


def layouts_of(hosts, ranks_per_host, hsdp=None):
    world = hosts * ranks_per_host
    return {
        "FSDP": list(range(world)),
        "HSDP": hsdp or [[h * ranks_per_host + i for i in range(ranks_per_host)] for h in range(hosts)],
        "replicate": [[r] for r in range(world)],
    }


def choose_layout(hosts, ranks_per_host, num_params, memory_limit, intra_gbps, cross_gbps, *,
                  check_memory=True, hsdp=None, layouts=None, ring_factors=True, replicas_send_a_shard=True):
    """The solution: the fastest of the three layouts that fit (with options for the wrong answers)."""
    param_bytes = 4 * num_params
    best = None
    for name, layout in (layouts or layouts_of(hosts, ranks_per_host, hsdp)).items():
        shards = len(layout[0]) if isinstance(layout[0], list) else len(layout)
        replicas = hosts * ranks_per_host // shards
        if check_memory and predict_state(num_params, shards) > memory_limit:
            continue
        spans = lambda group: len({r // ranks_per_host for r in group}) > 1
        rows = layout if isinstance(layout[0], list) else [layout]
        shard_speed = (cross_gbps if spans(rows[0]) else intra_gbps) * 1e9
        replica_speed = (cross_gbps if spans([row[0] for row in rows]) else intra_gbps) * 1e9
        shard_share = (shards - 1) / shards if ring_factors else float(shards > 1)
        replica_share = (replicas - 1) / replicas if ring_factors else float(replicas > 1)
        replicated = param_bytes / shards if replicas_send_a_shard else param_bytes
        seconds = 3 * shard_share * param_bytes / shard_speed + 2 * replica_share * replicated / replica_speed
        if best is None or seconds < best[0]:
            best = (seconds, layout)
    return best[1]


def always(name):
    return lambda hosts, ranks_per_host, *rest: layouts_of(hosts, ranks_per_host)[name]


def ignoring_memory(*args):
    return choose_layout(*args, check_memory=False)


def hard_coded_two_by_two(*args):  # right at 2 hosts x 2, the lab's shape
    return choose_layout(*args, layouts={"FSDP": [0, 1, 2, 3], "HSDP": [[0, 1], [2, 3]],
                                         "replicate": [[0], [1], [2], [3]]})


def hsdp_rows_of_two(hosts, ranks_per_host, *rest):  # the lab's HSDP rows, [0, 1], [2, 3], ..., on any hosts
    world = hosts * ranks_per_host
    return choose_layout(hosts, ranks_per_host, *rest, hsdp=[[r, r + 1] for r in range(0, world, 2)])


def swapped_orientation(hosts, ranks_per_host, *rest):  # HSDP chosen, then written one row per host position
    got = choose_layout(hosts, ranks_per_host, *rest)
    if got == layouts_of(hosts, ranks_per_host)["HSDP"] and 1 < ranks_per_host < hosts * ranks_per_host:
        return [list(column) for column in zip(*got)]  # rows [0, 2], [1, 3]: each shard group spans the hosts
    return got


def replicate_if_it_fits(hosts, ranks_per_host, num_params, memory_limit, *rest):  # no time compared
    for name, shards in (("replicate", 1), ("HSDP", ranks_per_host), ("FSDP", hosts * ranks_per_host)):
        if predict_state(num_params, shards) <= memory_limit:
            return layouts_of(hosts, ranks_per_host)[name]
    return layouts_of(hosts, ranks_per_host)["FSDP"]


def without_ring_factors(*args):  # every rank sends the whole P in each collective, not (n-1)/n of it
    return choose_layout(*args, ring_factors=False)


def replicas_reduce_whole_gradients(*args):  # HSDP's replicas all-reduce every gradient, not their 1/S shard
    return choose_layout(*args, replicas_send_a_shard=False)


def rule_read_off_the_cases(hosts, ranks_per_host, num_params, memory_limit, intra_gbps, cross_gbps):
    """No time computed: replicate on one host or with equal links, else HSDP if it fits, else FSDP."""
    named = layouts_of(hosts, ranks_per_host)
    if predict_state(num_params, 1) <= memory_limit and (hosts == 1 or intra_gbps == cross_gbps):
        return named["replicate"]
    if predict_state(num_params, ranks_per_host) <= memory_limit and hosts > 1:
        return named["HSDP"]
    if predict_state(num_params, 1) <= memory_limit:
        return named["replicate"]
    return named["FSDP"]


def a_typed_in_link_ratio(ratio):
    """A timing rule read off the cases: replicate where it fits and the cross link is over `ratio` of a host's
    speed, else HSDP where it fits, else FSDP. The cut-off is 2/3 (section 5's accounting); 1/2 and 3/4 both
    agree with every case but the ones between."""
    def choose(hosts, ranks_per_host, num_params, memory_limit, intra_gbps, cross_gbps):
        named = layouts_of(hosts, ranks_per_host)
        if predict_state(num_params, 1) <= memory_limit and (hosts == 1 or cross_gbps > ratio * intra_gbps):
            return named["replicate"]
        if predict_state(num_params, ranks_per_host) <= memory_limit and hosts > 1:
            return named["HSDP"]
        return named["replicate"] if predict_state(num_params, 1) <= memory_limit else named["FSDP"]
    return choose


@pytest.mark.parametrize("ratio, words", [
    (1 / 2, "2 hosts x 8 ranks.*95 GB/s between hosts: your layout \\[\\[0\\], \\[1\\], .* takes 78.9 ms .*HSDP .* "
            "fits too and takes 75.3 ms: every rank all-reduces all its gradients across hosts"),
    (3 / 4, "2 hosts x 8 ranks.*105 GB/s between hosts: your layout .* takes 74.8 ms .*replication fits too and "
            "takes 71.4 ms: it shards 8 ways though the whole model fits one rank"),
])
def test_layout_check_rejects_a_link_ratio_right_only_at_the_cases(ratio, words):
    for s in lab06.layout_cases()[:-2]:  # the cases before the two between: the rule chooses as the solution does
        assert a_typed_in_link_ratio(ratio)(*s.args()) == choose_layout(*s.args()), s
    with pytest.raises(CheckFailed, match=words):
        lab06.check_choose_layout(a_typed_in_link_ratio(ratio))


def strictly_under_the_limit(hosts, ranks_per_host, num_params, memory_limit, *rest):
    return choose_layout(hosts, ranks_per_host, num_params, memory_limit - 1, *rest)


def all_reduce_counted_once(hosts, ranks_per_host, num_params, memory_limit, intra_gbps, cross_gbps):
    """The solution's rule with the replicas' all-reduce sending (R-1)/R of a shard, not 2 (R-1)/R."""
    world, param_bytes, best = hosts * ranks_per_host, 4 * num_params, None
    for layout in layouts_of(hosts, ranks_per_host).values():
        shards = len(layout[0]) if isinstance(layout[0], list) else len(layout)
        replicas = world // shards
        if predict_state(num_params, shards) > memory_limit:
            continue
        rows = layout if isinstance(layout[0], list) else [layout]
        speed = lambda group: (cross_gbps if len({r // ranks_per_host for r in group}) > 1 else intra_gbps) * 1e9
        seconds = (3 * (shards - 1) / shards * param_bytes / speed(rows[0])
                   + (replicas - 1) / replicas * param_bytes / shards / speed([row[0] for row in rows]))
        if best is None or seconds < best[0]:
            best = (seconds, layout)
    return best[1]


def test_layout_check_accepts_the_solution(capsys):
    lab06.check_choose_layout(choose_layout)
    out = capsys.readouterr().out
    assert out.startswith("✓") and "all 14 cases (4 measured on 4 ranks, 10 of up to 32 ranks" in out


def test_layout_check_accepts_tuples_of_numpy_ints():
    import numpy as np

    def as_arrays(*args):  # numpy ints, tuples
        return tuple(tuple(np.int64(r) for r in row) if isinstance(row, list) else np.int64(row)
                     for row in choose_layout(*args))

    lab06.check_choose_layout(as_arrays)


def test_the_solution_meets_each_case_as_the_comments_say():
    cases = lab06.layout_cases()
    want = ["replicate", "FSDP", "HSDP", "replicate", "HSDP", "FSDP", "replicate", "replicate", "HSDP", "replicate",
            "HSDP", "HSDP", "HSDP", "replicate"]
    assert len(cases) == len(want)
    for s, name in zip(cases, want):
        got = choose_layout(*s.args())
        assert got == layouts_of(s.hosts, s.ranks_per_host)[name] or (
            s.ranks_per_host == 1 and name == "replicate" and got == layouts_of(s.hosts, 1)["HSDP"]), (s, got)


@pytest.mark.parametrize(
    "wrong, words",
    [
        (always("HSDP"), "1 host x 4 ranks.*takes .* per step .*replication fits too"),
        (always("FSDP"), "1 host x 4 ranks.*takes .* per step .*replication fits too"),
        (always("replicate"), "2 hosts x 2 ranks.*holds 470 KiB per rank .*over the 160 KiB limit"),
        (ignoring_memory, "2 hosts x 2 ranks.*over the 160 KiB limit"),
        (replicate_if_it_fits, "2 hosts x 2 ranks.*512 KiB.*HSDP .* fits too.*every rank all-reduces all its "
                               "gradients across hosts"),
        (hard_coded_two_by_two, "4 hosts x 8 ranks.*layout of ranks \\[0, 1, 2, 3\\]: this job has 32 ranks"),
        (hsdp_rows_of_two, "4 hosts x 8 ranks.*replica groups such as \\[0, 2, 4, .*1/2 of the gradients over the slow "
                           "link, where 8-way shards would send 1/8"),
        (swapped_orientation, "2 hosts x 2 ranks.*shard groups \\[0, 2\\], \\[1, 3\\] span hosts: every all-gather"),
        # with the formula wrong, FSDP over 8 beats HSDP where the links are equal
        (without_ring_factors, "2 hosts x 4 ranks.*25 GB/s between hosts: your layout \\[0, 1, 2, 3, 4, 5, 6, 7\\] "
                               "fits .* takes 420.0 ms .*HSDP .* fits too .*it shards 8 ways though 4-way fits"),
        (replicas_reduce_whole_gradients, "2 hosts x 4 ranks.*25 GB/s between hosts: your layout \\[0, 1, 2, 3, 4, 5, "
                                          "6, 7\\] fits .* takes 420.0 ms .*it shards 8 ways though 4-way fits"),
        # HSDP whenever there are hosts and it fits, though a fast cross link makes replication cheaper
        (rule_read_off_the_cases, "2 hosts x 8 ranks.*120 GB/s between hosts: your layout .* takes 74.2 ms .*"
                                  "replication fits too .*it shards 8 ways though the whole model fits one rank"),
        # "fits" read as strictly under the limit: HSDP's shards hold exactly 4 GB, the limit, and it picks FSDP
        (strictly_under_the_limit, "2 hosts x 4 ranks, 1,000,000,000 parameters, 3.73 GiB per rank.*your layout "
                                   "\\[0, 1, 2, 3, 4, 5, 6, 7\\] fits .*; HSDP holds exactly the 3.73 GiB limit per "
                                   "rank, and a layout that holds no more than the limit fits"),
        # an all-reduce counted as sending the gradients once, (R-1)/R, not twice (a reduce-scatter, then an
        # all-gather): replication looks cheaper than HSDP where the cross link is half as fast as a host's
        (all_reduce_counted_once, "2 hosts x 8 ranks.*75 GB/s between hosts: your layout \\[\\[0\\], \\[1\\], .* "
                                  "takes 100.0 ms .*HSDP .* fits too and takes 76.7 ms"),
        (lambda *args: "HSDP", "return a list of ranks"),
        (lambda *args: [[0, 1], [2]], "same length"),
        (lambda *args: [0, 1, 2, 3], "this job has 32 ranks"),
        (lambda *args: [0.0, 1.0, 2.0, 3.0], "rank numbers \\(ints\\)"),
    ],
)
def test_layout_check_rejects_wrong_answers(wrong, words):
    with pytest.raises(CheckFailed, match=words):
        lab06.check_choose_layout(wrong)


# ------------------------------------------------------------------------------ build on a mesh


def reset_every_module(model):
    for module in model.modules():
        if hasattr(module, "reset_parameters"):
            module.reset_parameters()
        elif isinstance(module, torch.nn.MultiheadAttention):
            module._reset_parameters()


def reset_seeding_each_module(model):  # "the same seed on every rank", set before each module's reset
    for module in model.modules():
        torch.manual_seed(0)
        if hasattr(module, "reset_parameters"):
            module.reset_parameters()
        elif isinstance(module, torch.nn.MultiheadAttention):
            module._reset_parameters()


def test_build_check_rejects_layers_that_start_as_copies_of_each_other():
    # every block's Linear and attention weights are the first block's: the replicas agree, every weight is
    # initialized, and 3 steps match one process started from the same weights, so only the start shows it
    with pytest.raises(CheckFailed, match="layers.0.* and layers.1.* start with the same weights") as failure:
        lab06.check_build_on_mesh(lambda mesh: build_on_mesh(mesh, reset=reset_seeding_each_module))
    assert "seed once, before the whole model is initialized" in str(failure.value)


def shard_bottom_up(model, block_mesh, root_mesh):
    """fully_shard each block on `block_mesh` (None: the default mesh over every rank), then the root."""
    from torch.distributed.fsdp import fully_shard

    for block in model.layers:
        fully_shard(block, mesh=block_mesh)
    fully_shard(model, mesh=root_mesh)


def build_on_mesh(mesh, *, materialize=True, reset=reset_every_module, blocks=True, shard_mesh=None):
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


def build_on_its_own_mesh(mesh):  # makes the lab's 2 x 2 mesh itself: the argument is ignored
    from torch.distributed.device_mesh import init_device_mesh

    return build_on_mesh(init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard")))


def build_on_the_shard_dim(mesh):  # "the shard dim" taken from a 2-D mesh, whatever it is given
    return build_on_mesh(mesh, shard_mesh=mesh["shard"])


def reset_all_but_attention(model):
    for module in model.modules():
        if hasattr(module, "reset_parameters"):
            module.reset_parameters()


def build_without_reset(mesh):
    model = build_on_mesh(mesh, reset=None)
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


with torch.random.fork_rng():  # "the model I already have", built whole in an earlier cell
    torch.manual_seed(0)
    BUILT_EARLIER = TinyTransformer(**lab06.HSDP_MODEL)


def build_from_a_copy(mesh):  # whole on every rank, copied in: no TinyTransformer made, no to_empty
    import copy

    model = copy.deepcopy(BUILT_EARLIER)
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


def test_build_check_accepts_a_model_built_in_a_meta_device_context(capsys):
    lab06.check_build_on_mesh(build_with_meta_context)
    assert capsys.readouterr().out.startswith("✓")


def build_blocks_on_the_default_mesh(mesh):  # the blocks sharded over all 4 ranks, the root over the given mesh
    from course_lib.models import TinyTransformer

    torch.manual_seed(0)
    model = TinyTransformer(**lab06.HSDP_MODEL, device="meta")
    shard_bottom_up(model, None, mesh)
    model.to_empty(device="cpu")
    reset_every_module(model)
    return model


def test_build_check_accepts_the_solution(capsys):
    lab06.check_build_on_mesh(build_on_mesh)
    out = capsys.readouterr().out
    assert out.startswith("✓") and "on a 1-D mesh of 4, 30,080" in out


@pytest.mark.parametrize(
    "build, words",
    [
        (lambda mesh: build_on_mesh(mesh, materialize=False), "never materialized"),
        (build_without_reset, "not initialized"),
        (lambda mesh: build_on_mesh(mesh, reset=reset_all_but_attention), "in_proj_weight"),
        (build_on_the_shard_dim, "placed \\(Shard\\(dim=0\\),\\); sharded on that mesh"),
        (lambda mesh: build_on_mesh(mesh, blocks=False), "one per block and the root"),
        (lambda mesh: None, "returned a NoneType"),
        (build_on_its_own_mesh, "ignored its mesh argument: given a 1-D mesh of the 4 ranks, its parameters are "
                                "placed \\(Replicate\\(\\), Shard\\(dim=0\\)\\)"),
        (build_whole_on_the_cpu, "built the TinyTransformer on cpu"),
        (build_on_the_cpu_then_reset, "built the TinyTransformer on cpu"),
        (build_seeded_by_rank, "the ranks start from different weights"),
        (build_materialized_before_sharding, "called to_empty before fully_shard"),
        (build_from_a_copy, "gave fully_shard a model already allocated on cpu"),
        (build_blocks_on_the_default_mesh,
         "placed \\(Replicate\\(\\), Shard\\(dim=0\\)\\), \\(Shard\\(dim=0\\),\\)"),
    ],
)
def test_build_check_rejects_wrong_answers(build, words):
    with pytest.raises(CheckFailed, match=words):
        lab06.check_build_on_mesh(build)


def predict_the_measured_model(num_params, world_size, reshard_after_forward, param_dtype):  # its own count
    from course_lib import memory
    from course_lib.models import TinyTransformer

    n = memory.count_params(TinyTransformer(**lab06.BYTES_MODEL, device="meta"))
    return predict_solution(n, world_size, reshard_after_forward, param_dtype)


def predict_the_measured_numbers(num_params, world_size, reshard_after_forward, param_dtype):  # looked up
    dtype = str(param_dtype).removeprefix("torch.")
    return lab06.measured_bytes(world_size)[1][(reshard_after_forward, dtype)]


@pytest.mark.parametrize("wrong", [predict_the_measured_model, predict_the_measured_numbers])
def test_bytes_check_rejects_an_answer_right_for_the_measured_model_only(wrong):
    with pytest.raises(CheckFailed, match=r"predict_held_bytes\(1,000,000, 8, .*\) gives .* the formula is right for "
                                          r"the measured model only"):
        lab06.check_bytes_prediction(wrong)
