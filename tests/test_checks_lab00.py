"""The 00_setup checks accept the solutions and reject plausible wrong answers."""
from __future__ import annotations

import sys

import cloudpickle
import pytest

from course_lib.checks import CheckFailed
from course_lib.checks import lab00

from conftest import rejects

# Ship this module's functions by value: otherwise each rank imports the test module (and pytest) to find them.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def test_reports_show_the_three_broken_states():
    reports = lab00.broken_reports()
    assert [reports[k].problems[0].code for k in "ABC"] == ["fbgemm-cuda-on-cpu", "version-lockstep", "nccl-without-gpu"]
    assert "fbgemm_gpu_config.so" in str(reports["A"]) or "fbgemm-gpu 1.8.0" in str(reports["A"])


def fix_for(report):
    diagnosis = next(line for line in report.splitlines() if line.startswith("✗"))
    if "out of lockstep" in diagnosis:
        return 3
    if "CUDA fbgemm-gpu" in diagnosis:
        return 2
    if "backend='nccl'" in diagnosis:
        return 5
    raise ValueError(diagnosis)


def test_fix_check_accepts_the_solution(capsys):
    lab00.check_fix_for(fix_for)
    assert capsys.readouterr().out.startswith("✓")


def by_other_words(report):  # another right reading: the words of the diagnosis, found another way
    diagnosis = [line for line in report.splitlines() if line.startswith("✗ ")][0].lower()
    return 5 if "nccl" in diagnosis else 3 if "lockstep" in diagnosis else 2


def test_fix_check_accepts_another_reading_of_the_diagnosis(capsys):
    lab00.check_fix_for(by_other_words)
    assert capsys.readouterr().out.startswith("✓")


SHOWN = {str(report): fix for report, fix in zip(lab00.broken_reports().values(), (2, 3, 5))}
CALLS = []


def remembers_the_three_reports(report):  # the lab's three reports, recognised whole
    return SHOWN[report]


def remembers_with_a_default(report):
    return SHOWN.get(report, 5)


def old_answer(report):  # the old exercise's answer: the three labels' fixes
    return {"A": 2, "B": 3, "C": 5}


def by_the_import_error(report):  # both A and B end in the same import error
    return 2 if "Could not load this library" in report else 5


def by_fbgemm_in_the_diagnosis(report):  # B's diagnosis names fbgemm too: "(it pairs with torch 2.13 and fbgemm 1.8)"
    diagnosis = next(line for line in report.splitlines() if line.startswith("✗"))
    return 2 if "fbgemm" in diagnosis else 3 if "torch" in diagnosis and "nccl" not in diagnosis else 5


def by_the_labs_versions(report):  # keys on what differs between A, B and C as shown
    return 3 if "2.12.0" in report else 2 if "fbgemm-gpu 1.8.0 (CUDA build)" in report else 5


def by_the_cpu_build_words(report):  # the words of A's and C's diagnoses: "on a CPU build", "is a CPU build"
    diagnosis = next(line for line in report.splitlines() if line.startswith("✗"))
    if "lockstep" in diagnosis:
        return 3
    return 2 if "installed on a CPU build" in diagnosis else 5 if "is a CPU build" in diagnosis else 1


def upgrades_torch(report):  # reads "out of lockstep" as "too old": the newest torchrec
    return fix_for(report) if "lockstep" not in report else (6 if "2.14" in report else 3)


def in_the_labs_order(report):  # A, B, C: the order the lab prints them
    CALLS.append(report)
    return (2, 3, 5)[(len(CALLS) - 1) % 3]


def the_fix_as_text(report):
    return lab00.FIXES[fix_for(report)]


def refuses(check, answer, *pieces):
    """`check(answer)` fails with a message (hint included) that holds every one of `pieces`."""
    message = rejects(check, answer, match=pieces[0])
    for piece in pieces[1:]:
        assert piece in message, message


UNSEEN_1 = "the report of a laptop with torch 2.14 (not shown in the lab)"
UNSEEN_2 = "the report of a laptop with PyPI's CUDA torch and the CUDA fbgemm (not shown in the lab)"
UNSEEN_3 = "the report of a laptop with PyPI's CUDA torch, asked for 4 NCCL ranks (not shown in the lab)"


@pytest.mark.parametrize(
    "wrong, pieces",
    [
        (remembers_the_three_reports, ("fix_for raised KeyError", UNSEEN_1)),
        (remembers_with_a_default, (f"{UNSEEN_1}: fix 5 does not cure it", "asks for no backend")),
        (old_answer, ("returned {'A': 2, 'B': 3, 'C': 5} (dict), not one of the fix numbers",)),
        (by_the_import_error, (f"{UNSEEN_1}: fix 2 does not cure it", "names what is out of step")),
        (by_fbgemm_in_the_diagnosis, (f"{UNSEEN_1}: fix 2 does not cure it", "same import error")),
        (by_the_labs_versions, (f"{UNSEEN_1}: fix 5 does not cure it", "asks for no backend")),
        (by_the_cpu_build_words, (f"{UNSEEN_2}: fix 1 does not cure it", "pulls fbgemm-gpu")),
        (upgrades_torch, (f"{UNSEEN_1}: fix 6 does not cure it", "move together")),
        (in_the_labs_order, (f"{UNSEEN_1}: fix 2 does not cure it",)),
        (the_fix_as_text, ("returned 'pip install torch==2.13.0", "(str), not one of the fix numbers")),
    ],
)
def test_fix_check_rejects_wrong_answers(wrong, pieces):
    CALLS.clear()
    refuses(lab00.check_fix_for, wrong, *pieces)


def by_the_cpu_build_words_then_nccl(report):  # A's words, then C's: "is a CPU build"
    diagnosis = next(line for line in report.splitlines() if line.startswith("✗"))
    if "lockstep" in diagnosis or "CUDA fbgemm-gpu" in diagnosis:
        return fix_for(report)
    return 5 if "is a CPU build" in diagnosis else 4


def test_fix_check_reads_an_nccl_report_with_other_words():
    refuses(lab00.check_fix_for, by_the_cpu_build_words_then_nccl, f"{UNSEEN_3}: fix 4 does not cure it", "which backend")


@pytest.mark.parametrize(
    "fixes, pieces",
    [
        ({"A": 1, "B": 3, "C": 5}, ("report A: fix 1 does not cure it", "pulls fbgemm-gpu")),
        ({"A": 2, "B": 6, "C": 5}, ("report B: fix 6 does not cure it", "move together")),
        ({"A": 2, "B": 3, "C": 4}, ("report C: fix 4 does not cure it", "which backend")),
        ({"A": 3, "B": 2, "C": 5}, ("report A: fix 3 does not cure it", "a build of fbgemm")),
        ({"A": 2, "B": 3, "C": 2}, ("report C: fix 2 does not cure it", "about the backend")),
    ],
)
def test_fix_check_names_the_report_and_why_on_the_labs_reports(fixes, pieces):
    shown = dict(zip((str(r) for r in lab00.broken_reports().values()), "ABC"))
    refuses(lab00.check_fix_for, lambda report: fixes[shown[report]] if report in shown else fix_for(report), *pieces)


def test_the_unseen_reports_are_the_three_diagnoses_in_other_words():
    unseen = lab00.unseen_reports()
    shown = {str(r) for r in lab00.broken_reports().values()}
    assert sorted(r.problems[0].code for r in unseen.values()) == sorted(lab00._RIGHT)
    assert all(len(r.problems) == 1 and str(r) not in shown for r in unseen.values())
    assert all(lab00.impossible(r.facts) == [] for r in unseen.values())


@pytest.mark.parametrize("which", range(6))
def test_the_right_fix_cures_every_report_the_check_reads(which):
    """Fix 2 swaps the CUDA fbgemm for the CPU one, fix 3 installs torch 2.13 from the CPU index, fix 5 starts the
    group on gloo: in simulation, the doctor finds nothing afterwards."""
    where, report = lab00._reports_to_read()[which]
    facts, fix = report.facts, lab00._RIGHT[report.problems[0].code]
    installed = {"torch": facts.torch_version, "fbgemm-gpu-cpu": "1.8.0", "torchrec": "1.8.0"}
    if fix == 3:
        installed["torch"] = "2.13.0+cpu"
    backend = "gloo" if fix == 5 else report.backend
    after = lab00.after_install(facts, installed)
    assert lab00.doctor(backend=backend, world_size=report.world_size, facts=after).problems == [], where


def solution():
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    return {"rank": dist.get_rank(), "world_size": dist.get_world_size(), "rank_sum": t.item()}


def no_all_reduce():
    import torch.distributed as dist

    return {"rank": dist.get_rank(), "world_size": dist.get_world_size(), "rank_sum": float(dist.get_rank())}


def averaged():
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    return {"rank": dist.get_rank(), "world_size": dist.get_world_size(), "rank_sum": t.item() / dist.get_world_size()}


def env_strings():
    import os

    import torch
    import torch.distributed as dist

    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    return {"rank": os.environ["RANK"], "world_size": os.environ["WORLD_SIZE"], "rank_sum": t.item()}


def test_first_group_check_accepts_the_solution(capsys):
    lab00.check_first_group(solution)
    assert capsys.readouterr().out.startswith("✓")


@pytest.mark.parametrize(
    "wrong, words",
    [(no_all_reduce, "all_reduce"), (averaged, "do not divide"), (env_strings, "must be ints")],
)
def test_first_group_check_rejects_wrong_answers(wrong, words):
    with pytest.raises(CheckFailed, match=words):
        lab00.check_first_group(wrong)


def test_check_failure_renders_as_two_lines_in_ipython():
    err = CheckFailed("wrong", "look here")
    assert err._render_traceback_() == ["✗ wrong", "  hint: look here"]


def from_the_world_size():
    import torch.distributed as dist

    n = dist.get_world_size()
    return {"rank": dist.get_rank(), "world_size": n, "rank_sum": n * (n - 1) / 2}


def typed_in():
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    return {"rank": dist.get_rank(), "world_size": 2, "rank_sum": 1.0}


def by_max():
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return {"rank": dist.get_rank(), "world_size": dist.get_world_size(), "rank_sum": t.item()}


def by_all_gather():
    import torch.distributed as dist

    ranks = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, dist.get_rank())
    return {"rank": dist.get_rank(), "world_size": dist.get_world_size(), "rank_sum": float(sum(ranks))}


def only_rank_0_reduces():
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(dist.get_rank())])
    if dist.get_rank() == 0:
        dist.all_reduce(t)
    return {"rank": dist.get_rank(), "world_size": dist.get_world_size(), "rank_sum": t.item()}


@pytest.mark.parametrize(
    "wrong, words",
    [
        (from_the_world_size, "ran no collective"),
        (typed_in, "reported itself as rank 0 of 2"),
        (by_max, "ReduceOp.MAX"),
        (by_all_gather, "ran all_gather_object"),
    ],
)
def test_first_group_check_rejects_more_wrong_answers(wrong, words):
    with pytest.raises(CheckFailed, match=words):
        lab00.check_first_group(wrong)


def test_first_group_check_ends_a_hang():
    with pytest.raises(CheckFailed, match="failed on 2 ranks"):
        lab00.check_first_group(only_rank_0_reduces, timeout=10)


# ------------------------------------------------------------------------- exercise 2: install_plan


def install_plan(facts):
    if facts.gpu_count > 0:
        return {"torch": "2.13.0+cu126", "fbgemm-gpu": "1.8.0", "torchrec": "1.8.0"}
    return {"torch": "2.13.0+cpu", "fbgemm-gpu-cpu": "1.8.0", "torchrec": "1.8.0"}


@pytest.mark.parametrize("build", ["cu118", "cu999", "cu1260"])
def test_install_plan_naming_a_build_that_does_not_exist_is_rejected(build):
    # the simulation used to read any cuNNN tag as a CUDA build ("cu118": CUDA 11.8) and install it
    def made_up_build(facts):
        plan = install_plan(facts)
        return {**plan, "torch": plan["torch"].replace("cu126", build)}

    message = rejects(lab00.check_install_plan, made_up_build,
                      match=f"installs torch 2.13.0+{build}, a build the course does not install")
    assert "2.13.0+cu126 for a GPU node" in message


def test_after_install_installs_no_build_it_does_not_know():
    node = lab00.broken_machines()["E (GPU node, CPU fbgemm)"]
    after = lab00.after_install(node, {"torch": "2.13.0+cu118", "fbgemm-gpu": "1.8.0", "torchrec": "1.8.0"})
    assert after.torch_version is None and after.torch_import_error and after.gpu_count == 0


PLAN: dict = {}


def one_plan_for_all(facts):  # the module-level plan, updated for each machine: every plan returned is the last one
    PLAN.clear()
    PLAN.update(install_plan(facts))
    return PLAN


def test_install_plan_that_keeps_one_plan_between_calls_is_rejected():
    rejects(lab00.check_install_plan, one_plan_for_all,
            match="calling install_plan again changed a dict that an earlier call of it had returned")


def test_install_plan_check_accepts_the_solution(capsys):
    lab00.check_install_plan(install_plan)
    assert capsys.readouterr().out.startswith("✓")


def test_every_machine_is_broken_before_the_fix():
    for facts in lab00.broken_machines().values():
        backend, world_size = lab00._backend_for(facts)
        assert lab00.doctor(backend=backend, world_size=world_size, facts=facts).problems


@pytest.mark.parametrize(
    "wrong, words",
    [
        (lambda facts: {"torch": "2.13.0+cpu", "fbgemm-gpu-cpu": "1.8.0", "torchrec": "1.8.0"}, "GPU node needs a CUDA build"),
        (lambda facts: {"torch": "2.13.0+cu126", "fbgemm-gpu": "1.8.0", "torchrec": "1.8.0"}, "laptop's CPU torch needs fbgemm-gpu-cpu"),
        (lambda facts: {**install_plan(facts), "torchrec": "1.9.0"}, "move together"),
        (lambda facts: {**install_plan(facts), "torch": facts.torch_version}, "move together"),  # keeps the old torch
        (lambda facts: {**install_plan(facts), "fbgemm-gpu": "1.8.0", "fbgemm-gpu-cpu": "1.8.0"}, "keep one fbgemm"),
        (lambda facts: {k: v for k, v in install_plan(facts).items() if k != "torchrec"}, "still needs torchrec"),
        (lambda facts: {"torch": "2.13.0+cu126", "fbgemm-gpu-cpu": "1.8.0", "torchrec": "1.8.0"} if facts.gpu_count else install_plan(facts),
         "fbgemm-gpu-cpu cannot"),
        (lambda facts: {**install_plan(facts), "torch": "2.13.0"}, "does not say which build"),
        (lambda facts: "pip install torch==2.13.0 fbgemm-gpu-cpu==1.8.0", "returned a str"),
        (lambda facts: {"torch": "2.13.0+cpu", "fbgemm_gpu": "1.8.0", "torchrec": "1.8.0"}, "names \\['fbgemm_gpu'\\]"),
    ],
)
def test_install_plan_check_rejects_wrong_answers(wrong, words):
    with pytest.raises(CheckFailed, match=words):
        lab00.check_install_plan(wrong)


# ------------------------------------------------------------------ more wrong answers (adversarial review)


def counts_the_ranks_then_uses_the_formula():  # one all_reduce, but of ones: the sum comes from n(n-1)/2
    import torch
    import torch.distributed as dist

    t = torch.ones(1)
    dist.all_reduce(t)
    n = int(t.item())
    return {"rank": dist.get_rank(), "world_size": n, "rank_sum": n * (n - 1) / 2}


def sum_and_count_in_one_tensor():  # a right answer: the rank first, more in the same tensor
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(dist.get_rank()), 1.0])
    dist.all_reduce(t)
    return {"rank": dist.get_rank(), "world_size": int(t[1].item()), "rank_sum": t[0].item()}


def test_first_group_check_rejects_an_all_reduce_of_something_else():
    rejects(lab00.check_first_group, counts_the_ranks_then_uses_the_formula, match="gave all_reduce [1.0], not its rank 0")


def test_first_group_check_accepts_more_in_the_reduced_tensor(capsys):
    lab00.check_first_group(sum_and_count_in_one_tensor)
    assert capsys.readouterr().out.startswith("✓")


def install_by_torch_build(facts):  # the machine's torch build decides: a laptop with a CUDA torch keeps it
    if facts.torch_cuda:
        return {"torch": "2.13.0+cu126", "fbgemm-gpu": "1.8.0", "torchrec": "1.8.0"}
    return {"torch": "2.13.0+cpu", "fbgemm-gpu-cpu": "1.8.0", "torchrec": "1.8.0"}


def install_for_eight_gpus(facts):  # the lab's GPU nodes have 8 GPUs
    if facts.gpu_count == 8:
        return {"torch": "2.13.0+cu126", "fbgemm-gpu": "1.8.0", "torchrec": "1.8.0"}
    return {"torch": "2.13.0+cpu", "fbgemm-gpu-cpu": "1.8.0", "torchrec": "1.8.0"}


def install_for_several_gpus(facts):  # a GPU node is taken to have several GPUs: one is not enough
    if facts.gpu_count > 1:
        return {"torch": "2.13.0+cu126", "fbgemm-gpu": "1.8.0", "torchrec": "1.8.0"}
    return {"torch": "2.13.0+cpu", "fbgemm-gpu-cpu": "1.8.0", "torchrec": "1.8.0"}


def install_keeping_the_build(facts):  # only the versions move: the machine's torch build (+cpu / +cu126) stays
    build = facts.torch_version.partition("+")[2]
    fbgemm = "fbgemm-gpu" if build.startswith("cu") else "fbgemm-gpu-cpu"
    return {"torch": f"2.13.0+{build}", fbgemm: "1.8.0", "torchrec": "1.8.0"}


@pytest.mark.parametrize(
    "wrong, words",
    [
        (install_by_torch_build, "machine G (laptop with the CUDA torch"),
        (install_for_eight_gpus, "machine H (GPU node with 4 GPUs"),
        (install_keeping_the_build, "machine G (laptop with the CUDA torch"),
        (install_for_several_gpus, "machine I (workstation with one GPU"),
    ],
)
def test_install_plan_check_repairs_machines_beyond_the_labs_list(wrong, words):
    rejects(lab00.check_install_plan, wrong, match=words)


def test_the_fresh_machines_are_broken_and_the_solution_repairs_them():
    for facts in lab00._fresh_machines().values():
        backend, world_size = lab00._backend_for(facts)
        assert lab00.doctor(backend=backend, world_size=world_size, facts=facts).problems
        fixed = lab00.after_install(facts, install_plan(facts))
        assert not [p for p in lab00.doctor(backend=backend, world_size=world_size, facts=fixed).problems if p.code != "python-version"]


# ------------------------------------------------ issue 25: machines a doctor could report, every argument used


def every_case():
    """Every EnvFacts the lab's checks show or hand to a learner's function, by name."""
    cases = {"healthy laptop": lab00.HEALTHY_LAPTOP, "GPU node": lab00.GPU_NODE}
    cases |= {f"report {label}": report.facts for label, report in lab00.broken_reports().items()}
    cases |= {**lab00.broken_machines(), **lab00._fresh_machines()}
    return cases


PLANS = {
    "solution": install_plan,
    "cpu everywhere": lambda facts: {"torch": "2.13.0+cpu", "fbgemm-gpu-cpu": "1.8.0", "torchrec": "1.8.0"},
    "cuda everywhere": lambda facts: {"torch": "2.13.0+cu126", "fbgemm-gpu": "1.8.0", "torchrec": "1.8.0"},
    "both fbgemm": lambda facts: {**install_plan(facts), "fbgemm-gpu": "1.8.0", "fbgemm-gpu-cpu": "1.8.0"},
    "no torch": lambda facts: {k: v for k, v in install_plan(facts).items() if k != "torch"},
    "no fbgemm": lambda facts: {k: v for k, v in install_plan(facts).items() if not k.startswith("fbgemm")},
    "no torchrec": lambda facts: {k: v for k, v in install_plan(facts).items() if k != "torchrec"},
    "old torch": lambda facts: {**install_plan(facts), "torch": "2.12.0+cpu"},
    "newest torchrec": lambda facts: {**install_plan(facts), "torchrec": "1.9.0"},
    "nothing": lambda facts: {},
}


@pytest.mark.parametrize("label", list(every_case()))
def test_every_machine_the_checks_use_is_one_the_doctor_could_report(label):
    assert lab00.impossible(every_case()[label]) == []


@pytest.mark.parametrize("plan", list(PLANS))
def test_after_install_gives_machines_the_doctor_could_report(plan):
    for facts in every_case().values():
        assert lab00.impossible(lab00.after_install(facts, PLANS[plan](facts))) == []


def test_this_machine_obeys_the_rules():  # the rules are collect_facts's: the real probe passes them
    from course_lib.env import collect_facts

    assert lab00.impossible(collect_facts()) == []


@pytest.mark.parametrize(
    "changes, words",
    [
        (dict(torch_cuda="12.6"), "CPU build"),  # a +cpu wheel that reports CUDA
        (dict(gpu_count=2), "gpu_count=2"),  # GPUs counted with CUDA unavailable
        (dict(torchmetrics_version=None), "torchrec.metrics probe"),  # the old HEALTHY_LAPTOP
        (dict(fbgemm_import_error=lab00.LOAD_ERROR), "fails when `import fbgemm_gpu` fails"),  # the old report A
        (dict(torchrec_version=None), "torchrec is not installed"),
        (dict(torch_version=None), "torch is not installed"),
        (dict(fbgemm_gpu_cpu_version=None), "no fbgemm distribution"),
        (dict(fbgemm_import_error="undefined symbol"), "ExceptionType: message"),
    ],
)
def test_impossible_machines_are_named(changes, words):
    from dataclasses import replace

    assert any(words in why for why in lab00.impossible(replace(lab00.HEALTHY_LAPTOP, **changes)))
    with pytest.raises(AssertionError, match="no doctor would report"):
        lab00._machine(lab00.HEALTHY_LAPTOP, **changes)


def test_a_cuda_torch_without_gpus_still_has_nccl():  # what lets machine G tell NCCL from GPUs
    from dataclasses import replace

    g = next(f for label, f in lab00._fresh_machines().items() if label.startswith("G"))
    assert g.nccl_available and g.gpu_count == 0
    assert lab00.impossible(replace(g, gpu_count=1)) != []


def _cuda_pair():
    return {"torch": "2.13.0+cu126", "fbgemm-gpu": "1.8.0", "torchrec": "1.8.0"}


def _cpu_pair():
    return {"torch": "2.13.0+cpu", "fbgemm-gpu-cpu": "1.8.0", "torchrec": "1.8.0"}


def install_by_core_count(facts):  # a GPU node has many cores, a laptop few
    return _cuda_pair() if facts.cpu_count > 8 else _cpu_pair()


def install_by_many_cores(facts):
    return _cuda_pair() if facts.cpu_count >= 32 else _cpu_pair()


def install_by_nccl(facts):  # NCCL available: a GPU node
    return _cuda_pair() if facts.nccl_available else _cpu_pair()


def install_by_cuda_fbgemm(facts):  # the CUDA fbgemm is there: a GPU node
    return _cuda_pair() if facts.fbgemm_gpu_version else _cpu_pair()


def install_by_cuda_available(facts):  # a right answer: CUDA available means GPUs, on any machine the doctor sees
    return _cuda_pair() if facts.cuda_available else _cpu_pair()


@pytest.mark.parametrize(
    "wrong, words",
    [
        (install_by_core_count, "(?s)machine G .*installs a CUDA build"),
        (install_by_many_cores, "(?s)machine H .*GPU node needs a CUDA build"),
        (install_by_nccl, "(?s)machine G .*installs a CUDA build"),
        (install_by_cuda_fbgemm, "(?s)machine A .*installs a CUDA build"),
    ],
)
def test_install_plan_check_rejects_answers_that_read_another_field(wrong, words):
    with pytest.raises(CheckFailed, match=words):
        lab00.check_install_plan(wrong)


def test_install_plan_check_accepts_cuda_available(capsys):
    lab00.check_install_plan(install_by_cuda_available)
    assert capsys.readouterr().out.startswith("✓")


def clears_the_gpus_it_has_read(facts):  # decides, then "tidies" the facts it was handed
    plan = install_plan(facts)
    object.__setattr__(facts, "gpu_count", 0)
    return plan


def test_install_plan_check_rejects_an_answer_that_changes_the_facts():
    rejects(lab00.check_install_plan, clears_the_gpus_it_has_read, match="install_plan changed its argument 1")


def test_the_check_hands_each_machine_unchanged_to_the_next_call():
    seen = []
    lab00.check_install_plan(lambda facts: seen.append(facts) or install_plan(facts))
    assert all(lab00.impossible(f) == [] for f in seen) and len(seen) == 8


def test_install_plan_check_rejects_versions_that_are_not_strings():
    rejects(lab00.check_install_plan, lambda facts: {**install_plan(facts), "torchrec": 1.8}, match="not strings")


# ------------------------------------------------------------------ wrong answers found later (adversarial fix)


def returns_the_tensor():  # rank_sum is the reduced tensor itself, not the number in it
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    return {"rank": dist.get_rank(), "world_size": dist.get_world_size(), "rank_sum": t}


def integer_tensor():  # a right answer: an int64 tensor, read with .item(), gives an int sum
    import torch
    import torch.distributed as dist

    t = torch.tensor([dist.get_rank()])
    dist.all_reduce(t)
    return {"rank": dist.get_rank(), "world_size": dist.get_world_size(), "rank_sum": t.item()}


def test_first_group_check_rejects_a_tensor_for_the_sum():
    rejects(lab00.check_first_group, returns_the_tensor, match="a tensor: the exercise asks for the sum, a number")


def test_first_group_check_accepts_an_integer_sum(capsys):
    lab00.check_first_group(integer_tensor)
    assert capsys.readouterr().out.startswith("✓")


def _pair(torch_version, stack):
    def plan(facts):
        if facts.gpu_count > 0:
            return {"torch": f"{torch_version}+cu126", "fbgemm-gpu": stack, "torchrec": stack}
        return {"torch": f"{torch_version}+cpu", "fbgemm-gpu-cpu": stack, "torchrec": stack}
    return plan


def install_matching_the_machines_torchrec(facts):  # the doctor's own basis: pair torch and fbgemm with its torchrec
    y = int(facts.torchrec_version.split(".")[1])
    return _pair(f"2.{y + 5}.0", f"1.{y}.0")(facts)


@pytest.mark.parametrize(
    "wrong, words",
    [
        # a whole stack one release up or down: in lockstep, so the doctor finds nothing, but not the course's
        (_pair("2.14.0", "1.9.0"), "(?s)machine A .*not the course's"),
        (_pair("2.12.0", "1.7.0"), "(?s)machine A .*not the course's"),
        (install_matching_the_machines_torchrec, "(?s)machine D .*'torchrec': '1.9.0'.*not the course's"),
    ],
)
def test_install_plan_check_rejects_a_stack_in_lockstep_off_the_pins(wrong, words):
    with pytest.raises(CheckFailed, match=words):
        lab00.check_install_plan(wrong)


def test_install_plan_check_accepts_patch_releases_of_the_pins(capsys):  # a right answer: 2.13.1 is torch 2.13
    lab00.check_install_plan(lambda facts: {**install_plan(facts), "torch": install_plan(facts)["torch"].replace("2.13.0", "2.13.1")})
    assert capsys.readouterr().out.startswith("✓")
