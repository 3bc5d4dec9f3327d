"""course_lib.cheaper: bytes of quantized tables, codecs, state without bookkeeping, and 2-rank variants."""
from __future__ import annotations

import pytest
import torch

from course_lib import cheaper, data, launch
from course_lib.trace import Collective


@pytest.mark.parametrize("precision, row", [("FP32", 160), ("FP16", 80), ("INT8", 48), ("INT4", 32), ("INT2", 16)])
def test_serving_bytes_are_padded_rows(precision, row):
    model = cheaper.quantize_tables({"a": (10, 40), "b": (3, 40)}, {"a": precision, "b": precision})
    assert cheaper.serving_bytes(model) == {"a": 10 * row, "b": 3 * row}
    assert cheaper.kernel_bytes(model) >= 13 * row


def test_quantize_rejects_an_unknown_precision():
    with pytest.raises(ValueError, match="unknown precision"):
        cheaper.quantize_tables({"a": (4, 8)}, {"a": "int8"})


def test_table_state_splits_scale_and_bias_and_skips_the_kernel_bookkeeping():
    state = cheaper.table_state(cheaper.quantize_tables({"a": (6, 16)}, {"a": "INT8"}))
    assert not any(".tbes." in key for key in state)
    shapes = {key.split(".")[-1]: tuple(value.shape) for key, value in state.items()}
    assert shapes == {"weight": (6, 16), "weight_qscale": (6, 1), "weight_qbias": (6, 1)}


def test_qcomm_registry_falls_back_to_fp16_on_cpu_only():
    cpu = cheaper.qcomm_registry("FP16", "BF16", "cpu")["POOLED_EMBEDDINGS_ALL_TO_ALL"]
    none = cheaper.qcomm_registry("FP16", "BF16", None)["POOLED_EMBEDDINGS_ALL_TO_ALL"]
    assert (str(cpu.backward._comm_precision), str(none.backward._comm_precision)) == ("fp16", "bf16")
    assert cheaper.qcomm_registry("FP32", "FP32") is None


def test_wire_bytes_sorts_collectives_by_what_they_carry():
    def record(op, dtype, n):
        return Collective(op=op, phase="", dtype=dtype, in_shapes=((n,),), out_shapes=((n,),), bytes_in=n, bytes_out=n,
                          group_size=2, operator="c10d.x")

    records = [[record("all_to_all", "int64", 10), record("reduce_scatter", "float16", 7)],
               [record("all_to_all", "float32", 5), record("all_reduce", "float32", 3)]]
    assert cheaper.wire_bytes(records) == {"ids": 10, "embeddings": 12, "dense gradients": 3}


def test_fp16_tables_halve_the_weights_not_the_optimizer_state():
    log = data.make_click_log(data.ClickLogConfig(num_train=4_000, num_test=1_000))
    variants = [cheaper.Variant("fp32"), cheaper.Variant("fp16", table_dtype="FP16"),
                cheaper.Variant("comms", table_dtype="FP16", comms=("FP16", "FP16"))]
    fp32, fp16, comms = launch(cheaper.compare_variants, log, variants, world_size=2, show_ranks=[])[0]
    assert fp16["weight_bytes"] * 2 == fp32["weight_bytes"] == 520 * 32 * 4
    assert fp16["optimizer_bytes"] == fp32["optimizer_bytes"] == 520 * 4  # row-wise Adagrad: one fp32 per row
    assert 0.5 < fp16["auc"] < 1 and fp16["nan_step"] is None
    pooled = {r.dtype for r in comms["records"] if r.op == "all_to_all" and "int" not in r.dtype}
    assert pooled == {"float16"}


def test_request_batches_send_each_user_once_and_expand_to_the_flat_rows():
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig

    users, items = cheaper.ranking_requests(3, 4, num_users=10, num_items=10, seed=1)
    flat, deduplicated = cheaper.request_batches(users, items)
    assert deduplicated.stride_per_key() == [3, 12] and flat.stride() == 12
    assert torch.equal(deduplicated["user"].values(), users)
    inverse = deduplicated.inverse_indices()[1]
    assert torch.equal(deduplicated["user"].values()[inverse[0]], flat["user"].values())
    variable = cheaper.as_variable_batch(flat)
    assert variable.stride_per_key() == [12, 12] and torch.equal(variable.values(), flat.values())


def test_an_exported_model_answers_in_a_process_without_torchrec(tmp_path):
    log = data.make_click_log(data.ClickLogConfig(num_train=2_000, num_test=600))
    model = cheaper.train_reference(log, epochs=1)
    quantized = cheaper.quantize(model, {t.name: "INT8" for t in log.config.tables()})
    artifact = cheaper.export_for_serving(quantized, list(data.SPARSE_FEATURES), str(tmp_path / "m.pt"))
    requests = cheaper.write_requests(log.test, (1, 8), str(tmp_path / "r.pt"))
    answer = cheaper.serve_in_another_process(artifact, requests, repeats=5)
    logits, _ = cheaper.predict(quantized, log.test)
    assert answer["modules"] == []
    assert torch.allclose(torch.tensor(answer["report"]["8"]["first_scores"]), torch.sigmoid(logits[:3]))
    assert set(answer["report"]) == {"1", "8"} and answer["report"]["8"]["p99_ms"] >= answer["report"]["8"]["p50_ms"]
    full = cheaper.artifact_bytes(cheaper.export_for_serving(model, list(data.SPARSE_FEATURES), str(tmp_path / "f.pt")))
    small = cheaper.artifact_bytes(artifact)
    table_bytes = sum(t.num_embeddings * t.embedding_dim * 4 for t in log.config.tables(cheaper.TABLE_DIM))
    assert full["tensors"] > table_bytes > small["tensors"] and full["debug"] > 0


def test_row_wise_after_a_variable_batch_takes_only_variable_batches():
    sequence = ["deduplicated", "flat", "flat as variable batch"]
    (steps,) = launch(cheaper.dedup_lookups, "row_wise", [sequence], num_requests=2, items_per_request=4, repeats=1,
                      world_size=2, show_ranks=[])[0]
    dedup, flat, variable = steps
    assert "input_splits" in flat["error"]
    assert torch.equal(dedup["output"], variable["output"]) and dedup["output"].shape == (8, 64)
