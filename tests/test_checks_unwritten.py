"""A check run before its exercise is written says so in one line, in every lab; a real error still shows."""
from __future__ import annotations

import sys
from typing import Any, Callable

import cloudpickle
import pytest

from course_lib import LaunchError, launch
from course_lib.checks import CheckFailed, exercise, lab00, lab01, lab02, lab03, lab04, lab05, lab06, lab07, lab08, lab09, lab10, lab11, lab12

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def stub(name: str) -> Callable[..., Any]:
    """An exercise function as the lab ships it: its body is ``raise NotImplementedError()``."""

    def unwritten(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError()

    unwritten.__name__ = name
    return unwritten


class AppState:  # lab 08's exercise 1 as shipped: both methods unwritten
    def __init__(self, model: Any, optimizer: Any, step: int = 0) -> None:
        self.model, self.optimizer, self.step = model, optimizer, step

    def state_dict(self) -> Any:
        raise NotImplementedError()

    def load_state_dict(self, state_dict: Any) -> None:
        raise NotImplementedError()


def shard_dense_stub() -> type:
    """Lab 07's exercise 1 as shipped: a DataParallelWrapper whose wrap() is unwritten."""
    from torchrec.distributed.model_parallel import DataParallelWrapper

    class ShardDenseWithFSDP(DataParallelWrapper):
        def wrap(self, dmp: Any, env: Any, device: Any) -> None:
            raise NotImplementedError()

    return ShardDenseWithFSDP


def pipelined_model_stub() -> type:
    """Lab 04's exercise 4 as shipped: a DLRMTrain subclass whose forward is unwritten."""
    from torchrec.models.dlrm import DLRMTrain

    class PipelinedModel(DLRMTrain):
        def forward(self, batch: Any) -> Any:
            raise NotImplementedError()

    return PipelinedModel


# check, its arguments (the unwritten answer first), and the name the verdict must give.
# Where the stub is called: the check's process (lab 02, 04 auc_gap, 05 state_bytes, 09), a launched rank
# (00, 04 wrap, 05, 06, 07, 08), or the check's own `except` (lab 02's "raised ..." reports).
CASES = {
    "00 fix_for": (lab00.check_fix_for, [stub("fix_for")], "fix_for"),
    "00 install_plan": (lab00.check_install_plan, [stub("install_plan")], "install_plan"),
    "00 first_group": (lab00.check_first_group, [stub("first_group")], "first_group"),
    "01 route_ids": (lab01.check_route_ids, [stub("route_ids")], "route_ids"),
    "01 global_mean": (lab01.check_global_mean, [stub("global_mean")], "global_mean"),
    "01 slice_of_sum": (lab01.check_slice_of_sum, [stub("my_slice_of_sum")], "my_slice_of_sum"),
    "02 kjt_from_samples": (lab02.check_kjt_from_samples, [stub("kjt_from_samples")], "kjt_from_samples"),
    "02 feature_columns": (lab02.check_feature_columns, [stub("feature_columns")], "feature_columns"),
    "02 word_tables": (lab02.check_word_tables, [stub("word_tables")], "word_tables"),
    "02 fixed_model": (lab02.check_fixed_model, [stub("FixedRecModel")], "FixedRecModel"),
    "03 row_wise": (lab03.check_row_wise, [stub("row_wise_item_plan"), stub("shard_rows")], "row_wise_item_plan"),
    "03 steering": (lab03.check_steering, [stub("steering_constraints"), stub("hosts_of")], "steering_constraints"),
    "04 wrap": (lab04.check_wrap, [stub("wrap")], "wrap"),
    "04 train_step": (lab04.check_train_step, [stub("train_step")], "train_step"),
    "04 auc_gap": (lab04.check_auc_gap, [stub("auc_gap")], "auc_gap"),
    "04 pipelineable": (lab04.check_pipelineable, [pipelined_model_stub(), stub("prepare")], "PipelinedModel"),
    "05 rowwise_sharder": (lab05.check_rowwise_sharder, [stub("rowwise_adagrad_sharder")], "rowwise_adagrad_sharder"),
    "05 combined_optimizer": (lab05.check_combined_optimizer, [stub("combined_optimizer")], "combined_optimizer"),
    "05 state_bytes": (lab05.check_state_bytes, [stub("state_bytes_per_rank"), {}], "state_bytes_per_rank"),
    "05 budget_choice": (lab05.check_budget_choice, [stub("choose_sharder")], "choose_sharder"),
    "06 shard": (lab06.check_shard, [stub("shard")], "shard"),
    "06 bytes": (lab06.check_bytes_prediction, [stub("predict_held_bytes")], "predict_held_bytes"),
    "06 choose_layout": (lab06.check_choose_layout, [stub("choose_layout")], "choose_layout"),
    "06 build_on_mesh": (lab06.check_build_on_mesh, [stub("build_on_mesh")], "build_on_mesh"),
    "07 wrapper": (lab07.check_wrapper, [shard_dense_stub()], None),  # its own words: "the wrapper"
    "07 dense_bytes": (lab07.check_dense_bytes, [stub("fsdp_dense_bytes")], "fsdp_dense_bytes"),
    "08 app_state": (lab08.check_app_state, [AppState], "AppState"),
    "08 save": (lab08.check_save, [stub("save")], "save"),
    "08 reload": (lab08.check_reload, [stub("reload")], "reload"),
    "08 mixed_reload": (lab08.check_mixed_reload, [stub("reload_mixed")], "reload_mixed"),
    "09 load_factor": (lab09.check_load_factor, [stub("largest_fitting_load_factor")], "largest_fitting_load_factor"),
    "09 budget_plan": (lab09.check_budget_plan, [stub("choose_constraints")], "choose_constraints"),
    "09 lookup_bandwidth": (lab09.check_lookup_bandwidth, [stub("lookup_gb_per_s")], "lookup_gb_per_s"),
    "09 torchrun_command": (lab09.check_torchrun_command, [stub("torchrun_command")], "torchrun_command"),
    "10 shared_row_fraction": (lab10.check_shared_row_fraction, [stub("shared_row_fraction")], "shared_row_fraction"),
    "10 table_choice": (lab10.check_table_choice, [stub("choose_table"), None, 12 * 1024, 0.01], "choose_table"),
    "10 shard_of": (lab10.check_shard_of, [stub("shard_of")], "shard_of"),
    "10 info_nce": (lab10.check_info_nce, [stub("info_nce")], "info_nce"),
    "11 qcomm_sharder": (lab11.check_qcomm_sharder, [stub("qcomm_sharder")], "qcomm_sharder"),
    "11 serving_row_bytes": (lab11.check_serving_row_bytes, [stub("serving_row_bytes")], "serving_row_bytes"),
    "11 deduplicate": (lab11.check_deduplicate, [stub("deduplicate")], "deduplicate"),
    "11 precision_choice": (lab11.check_precision_choice, [stub("choose_precisions"), {"t_user": (500, 32)},
                            {"t_user": dict.fromkeys(["FP32", "FP16", "INT8", "INT4", "INT2"], 0.0)}, 20_000],
                            "choose_precisions"),
    "12 block_plan": (lab12.check_block_plan, [stub("block_plan")], "block_plan"),
    "12 bytes_per_rank": (lab12.check_bytes_per_rank, [stub("bytes_per_rank")], "bytes_per_rank"),
    "12 choose_mesh": (lab12.check_choose_mesh, [stub("choose_mesh")], "choose_mesh"),
    "12 sampled_softmax": (lab12.check_sampled_softmax, [stub("sampled_softmax")], "sampled_softmax"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_unwritten_exercise_gets_one_line_that_says_so(case):
    check, args, name = CASES[case]
    kwargs = {"num_rows": 1_000, "embedding_dim": 16, "world_size": 2} if case == "05 state_bytes" else {}
    with pytest.raises(CheckFailed) as failure:
        check(*args, **kwargs)
    assert "not written yet" in failure.value.problem, failure.value.problem
    if name is not None:
        assert failure.value.problem.startswith(name), failure.value.problem
    assert "NotImplementedError()" in failure.value.hint


def test_a_not_implemented_error_with_a_message_is_a_real_error():
    @exercise
    def check_something(answer):
        answer()

    def answer():
        raise NotImplementedError("Could not run 'aten::foo' with arguments from the 'Meta' backend")

    with pytest.raises(NotImplementedError, match="Could not run"):
        check_something(answer)


def test_a_launch_that_failed_for_another_reason_is_not_called_unwritten():
    def on_rank():
        import time

        import torch.distributed as dist

        if dist.get_rank() == 1:
            raise ValueError("a real bug")
        time.sleep(2)
        raise NotImplementedError()  # rank 0 too (if not stopped first), after rank 1: the first failure decides

    @exercise
    def check_something(answer):
        launch(answer, world_size=2, show_ranks=[], timeout=60)

    with pytest.raises(LaunchError, match="a real bug"):
        check_something(on_rank)


def test_a_check_that_passes_still_passes(capsys):
    @exercise
    def check_double(double):
        assert double(2) == 4
        print("✓ doubles")

    check_double(lambda x: 2 * x)
    assert capsys.readouterr().out == "✓ doubles\n"
