"""course_lib.collisions and the drifting log: modulo hashing, managed collisions (unsharded and sharded)."""
from __future__ import annotations

import pytest
import torch
from torchrec import KeyedJaggedTensor

from course_lib import collisions, data, launch
from course_lib.checks import lab10


def kjt(ids: list[int], feature: str = "item") -> KeyedJaggedTensor:
    return KeyedJaggedTensor(keys=[feature], values=torch.tensor(ids), lengths=torch.ones(len(ids), dtype=torch.long))


def tiny(policy: str, rows: int = 8):
    return collisions.zch_ebc(collisions.id_tables(rows, features=("item",)), policy)


BATCHES = [[101, 102, 103], [104, 105, 106], [107, 108, 101], [201, 202, 203], [204, 205, 101]]


def feed(module, batches):
    module.train()
    for ids in batches:
        module(kjt(ids))


@pytest.fixture(scope="module")
def log() -> data.DriftingLog:
    return data.make_drifting_log(data.DriftConfig(num_days=3, rows_per_day=6_000, num_users=200, num_items=400))


# ------------------------------------------------------------------------------------------ the log


def test_the_drifting_log_is_seeded_and_drifts(log):
    again = data.make_drifting_log(log.config)
    assert all(torch.equal(a.labels, b.labels) and torch.equal(a.ids["item"][0], b.ids["item"][0])
               for a, b in zip(log.days, again.days))
    assert torch.unique(torch.cat([log.user_ids, log.item_ids])).numel() == 600  # distinct raw ids
    assert int(log.item_ids.max()) < 2**40 and int(log.item_ids.max()) > 2**32  # spread over 40 bits
    assert bool(log.first_seen(0).all())
    for day in (1, 2):
        new = log.first_seen(day)
        assert 0 < float(new.float().mean()) < 0.8  # new items every day, and old ones too
        earlier = torch.cat([log.days[d].ids["item"][0] for d in range(day)])
        assert not torch.isin(log.days[day].ids["item"][0][new], earlier).any()
    for split in log.days:
        assert 0.7 < data.bayes_optimal_auc(split) < 0.9


def test_content_follows_the_planted_item(log):
    ids = log.days[1].ids["item"][0][:50]
    content = log.item_content(ids)
    index = [int((log.item_ids == i).nonzero()) for i in ids]
    assert torch.equal(content, log.content[index])
    with pytest.raises(KeyError):
        log.item_content(torch.tensor([int(log.item_ids.max()) + 1]))
    # the content carries the item's planted bias (what cold-start features are for)
    corr = torch.corrcoef(torch.stack([log.content @ torch.linalg.lstsq(log.content, log.truth["item_bias"][:, None]).solution[:, 0],
                                       log.truth["item_bias"]]))[0, 1]
    assert corr > 0.8


# ------------------------------------------------------------------------------------- the modules


def test_modulo_hashing_maps_id_mod_rows():
    module = collisions.hashed_ebc(collisions.id_tables(16, features=("item",)))
    ids = torch.tensor([3, 19, 2**40 + 5, 35])
    assert module.remap(kjt(ids.tolist()))["item"].values().tolist() == [3, 3, (2**40 + 5) % 16, 3]
    assert torch.equal(collisions.rows_of(module, "item", ids), ids % 16)
    assert collisions.miss_row(module, "item") is None


def test_managed_collisions_give_each_resident_its_own_row_and_misses_one_row():
    module = tiny("lru")
    feed(module, BATCHES)
    residents = collisions.resident_ids(module, "item")
    assert len(residents) == 7 and len(set(residents.values())) == 7  # 8 rows, one kept for misses
    assert collisions.miss_row(module, "item") == 7 and 7 not in residents.values()
    assert 101 in residents  # seen in batches 1, 3, 5: LRU keeps it
    # rows_of reads the map without admitting anything, as an eval-mode forward does
    module.eval()
    probe = torch.tensor([101, 999, 204])
    module(kjt(probe.tolist()))  # an eval-mode forward admits nothing
    assert collisions.rows_of(module, "item", probe).tolist() == [residents[101], 7, residents[204]]
    assert collisions.resident_ids(module, "item") == residents


def test_lfu_on_a_full_table_sends_every_new_id_to_the_miss_row():
    lfu, dlfu = tiny("lfu"), tiny("distance_lfu")
    feed(lfu, BATCHES)
    feed(dlfu, BATCHES)
    assert collisions.rows_of(lfu, "item", torch.tensor([201, 202, 203, 204, 205])).tolist() == [7] * 5
    assert 7 not in collisions.rows_of(dlfu, "item", torch.tensor([204, 205])).tolist()
    with pytest.raises(ValueError, match="eviction policy must be one of"):
        tiny("fifo")


def test_unsharded_eviction_leaves_the_row_to_the_next_id():
    module = tiny("lru")
    feed(module, BATCHES)
    weight = module._embedding_module.embedding_bags["t_item"].weight
    before, owners = weight.detach().clone(), {r: i for i, r in collisions.resident_ids(module, "item").items()}
    feed(module, [[301, 302, 303]])
    changed = [r for i, r in collisions.resident_ids(module, "item").items() if owners.get(r) != i]
    assert len(changed) == 3 and torch.equal(before[changed], weight[changed])


def test_shared_row_fraction():
    assert collisions.shared_row_fraction(torch.tensor([5, 5, 7, 9]), torch.tensor([1, 1, 1, 2])) == pytest.approx(2 / 3)
    assert collisions.shared_row_fraction(torch.tensor([1, 2]), torch.tensor([0, 1])) == 0.0


def test_run_days_scores_each_day_before_training_on_it(log):
    torch.manual_seed(0)
    full = {f: log.vocabulary(f) + 1 for f in ("user", "item")}
    exact = collisions.run_days(collisions.IdClickModel(collisions.zch_ebc(collisions.id_tables(full), "lru"), 4), log)
    torch.manual_seed(0)
    modulo = collisions.run_days(collisions.IdClickModel(collisions.hashed_ebc(collisions.id_tables(64)), 4), log)
    assert [r.day for r in exact] == [1, 2]
    assert all(r.item_collisions == 0 for r in exact)
    # a table with a row per id still misses the ids it has not seen: exactly the day's new-item impressions
    for r in exact:
        assert r.item_misses == pytest.approx(float(log.first_seen(r.day).float().mean()))
    assert all(r.item_collisions > 0.5 and r.item_misses == 0 for r in modulo)
    assert all(0.5 < r.auc < r.bayes_auc for r in exact + modulo)


# ------------------------------------------------------------------------------------------ sharded


def test_sharded_managed_collisions_remap_as_unsharded_blocks_and_route_by_input_hash_size():
    g = torch.Generator().manual_seed(0)
    pool = torch.randint(0, 2**40, (60,), generator=g)
    batches = [[pool[torch.randint(0, 60, (12,), generator=g)] for _ in range(2)] for _ in range(10)]
    for hash_size in (2**63 - 1, 2**40):
        parts = launch(collisions.sharded_residents, 16, "lru", hash_size, batches, world_size=2, show_ranks=[])
        expected = collisions.reference_residents(16, "lru", hash_size, batches, world_size=2)
        assert [p["rows"] for p in parts] == [(0, 8), (8, 16)]
        assert parts[0]["module"] == "ShardedManagedCollisionEmbeddingBagCollection"
        for rank, (part, want) in enumerate(zip(parts, expected)):
            assert part["residents"] == want
            owned = torch.tensor(list(part["residents"]), dtype=torch.long)
            # the check's reference for "which rank owns an id" is what TorchRec really does
            assert bool((lab10.shard_of(owned, hash_size, 2) == rank).all())
        sizes = [len(p["residents"]) for p in parts]
        assert sizes == ([7, 0] if hash_size == 2**63 - 1 else [7, 7])


# ------------------------------------------------------------------------------------------ cold start


def test_content_models_and_alignment(log):
    from course_lib import coldstart

    results = {}
    for mode, align in (("ids", None), ("joint", None), ("fallback", None), ("fallback", coldstart.reference_info_nce)):
        torch.manual_seed(0)
        results[mode, align is not None] = coldstart.run_cold_start(coldstart.ContentClickModel(log, mode), log, align=align)
    ids, joint = results["ids", False], results["joint", False]
    # the content carries the new items' planted effects: joint training lifts their AUC well above the miss row's
    assert joint.new_auc > ids.new_auc + 0.03
    # an unaligned fallback projection is untrained; InfoNCE makes it stand in for the id embedding
    assert results["fallback", True].new_auc > results["fallback", False].new_auc + 0.03
    with pytest.raises(ValueError, match="mode must be one of"):
        coldstart.ContentClickModel(log, "both")


def test_fallback_uses_content_exactly_for_items_the_table_does_not_hold(log):
    from course_lib import coldstart

    model = coldstart.ContentClickModel(log, "fallback")
    split = log.days[0]
    model.train()
    model(split.kjt(0, 64), split.dense[:64])  # admits the batch's ids
    features = split.kjt(0, 128)
    model.eval()
    _, item_id, content, misses = model.parts(features)
    vector = model.item_vector(item_id, content, misses)
    admitted = torch.isin(features["item"].values(), split.ids["item"][0][:64])
    assert torch.equal(misses, ~admitted)
    assert torch.equal(vector[misses], content[misses]) and torch.equal(vector[~misses], item_id[~misses])


def test_reference_info_nce_is_lowest_when_each_id_matches_its_own_content():
    from course_lib import coldstart

    g = torch.Generator().manual_seed(0)
    a = torch.randn(16, 8, generator=g)
    matched = coldstart.reference_info_nce(a, a, 0.1)
    shuffled = coldstart.reference_info_nce(a, a[torch.randperm(16, generator=g)], 0.1)
    assert matched < 0.1 < shuffled


def test_new_ids_learning_curve_rises_from_the_miss_row(log):
    from course_lib import coldstart

    curve = coldstart.new_id_learning_curve(log, "rowwise_adagrad", 0.2, day=2, every=4)
    assert curve["step"][:3] == [0, 4, 8]
    assert curve["new items"][-1] > curve["new items"][0] + 0.02
    with pytest.raises(ValueError, match="kind must be"):
        coldstart.new_id_learning_curve(log, "adam", 0.1, day=1)
