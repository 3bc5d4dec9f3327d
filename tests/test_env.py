"""The install doctor: the healthy state of this machine, and each known broken state simulated from it."""
from __future__ import annotations

import dataclasses
import re
import subprocess
import sys

import pytest

from course_lib import env
from course_lib.env import EnvFacts, Problem, Report, collect_facts, diagnose, doctor

from conftest import REPO

CUDA_FBGEMM_ERROR = (
    "OSError: Could not load this library: /venv/lib/python3.11/site-packages/fbgemm_gpu/fbgemm_gpu_config.so\n"
    "libcudart.so.12: cannot open shared object file"
)
UNDEFINED_SYMBOL = "OSError: /venv/.../fbgemm_gpu_py.so: undefined symbol: _ZN3c1017RegisterOperatorsD1Ev"


@pytest.fixture(scope="module")
def healthy() -> EnvFacts:
    """The facts of this machine, probed once (the course's CPU stack, correctly installed)."""
    return collect_facts()


@pytest.fixture
def gpu_node(healthy: EnvFacts) -> EnvFacts:
    """A healthy 2-GPU node with the CUDA builds."""
    return dataclasses.replace(
        healthy, torch_version="2.13.0+cu126", torch_cuda="12.6", cuda_available=True, gpu_count=2,
        nccl_available=True, nccl_version="2.27.5", fbgemm_gpu_version="1.8.0", fbgemm_gpu_cpu_version=None,
    )


def codes(problems: list[Problem]) -> list[str]:
    return [p.code for p in problems]


def only(problems: list[Problem], code: str) -> Problem:
    assert codes(problems) == [code], problems
    return problems[0]


# ------------------------------------------------------------------------------------ this machine


def test_collect_facts_sees_the_course_cpu_stack(healthy: EnvFacts) -> None:
    """The CPU build (setup's, from the PyTorch CPU index or a local wheel) or PyPI's CUDA build (setup's where only
    PyPI is reachable, and what a plain `pip install torch` gives on Linux), with the CPU fbgemm and no GPU."""
    assert healthy.fbgemm_gpu_cpu_version == "1.8.0"
    assert healthy.fbgemm_gpu_version is None
    assert healthy.torchrec_version == "1.8.0"
    assert healthy.torch_import_error is None
    assert healthy.fbgemm_import_error is None
    assert healthy.torchrec_import_error is None
    if healthy.cuda_build:  # PyPI's wheel: its metadata says 2.13.0, torch.__version__ 2.13.0+cu130
        assert healthy.torch_version == "2.13.0" and re.fullmatch(r"\d+\.\d+", healthy.torch_cuda or "")
    else:
        assert re.fullmatch(r"2\.13\.0(\+cpu)?", healthy.torch_version or "")
        assert healthy.torch_cuda is None
        assert not healthy.nccl_available and healthy.nccl_version is None
    assert healthy.torchmetrics_version == env.PINNED_TORCHMETRICS
    assert healthy.rec_metrics_error is None  # torchrec.metrics really computed an NE here
    assert not healthy.cuda_available and healthy.gpu_count == 0
    assert healthy.cpu_count and healthy.cpu_count >= 1
    assert healthy.python_version.split(".")[:2] in (["3", "11"], ["3", "12"], ["3", "13"])
    assert healthy.fbgemm_distribution == ("fbgemm-gpu-cpu", "1.8.0")


def test_collect_facts_sees_the_torchmetrics_that_torchrec_declares(healthy: EnvFacts) -> None:
    assert healthy.torchmetrics_wanted == "1.0.3"
    assert healthy.torchmetrics_version == healthy.torchmetrics_wanted


def test_a_torchmetrics_other_than_torchrecs_is_reported(healthy: EnvFacts) -> None:
    problem = only(diagnose(dataclasses.replace(healthy, torchmetrics_version="1.9.0")), "torchmetrics-version")
    assert "torchmetrics 1.9.0" in problem.summary and "frozen dataclass" in problem.summary
    assert problem.fix.startswith("pip install torchmetrics==1.0.3")
    # without torchrec, or without a pin in its metadata, there is nothing to compare with
    assert diagnose(dataclasses.replace(healthy, torchmetrics_version="1.9.0", torchmetrics_wanted=None)) == []


def test_healthy_facts_have_no_problem(healthy: EnvFacts) -> None:
    assert diagnose(healthy) == []
    assert diagnose(healthy, backend="gloo", world_size=4) == []
    assert diagnose(healthy, backend="auto", world_size=2) == []


def test_nccl_on_this_cpu_machine(healthy: EnvFacts) -> None:
    p = only(diagnose(healthy, backend="nccl", world_size=2), "nccl-without-gpu")
    assert p.severity == "error" and "gloo" in p.fix
    if healthy.cuda_build:  # PyPI's torch: NCCL is compiled in, but there is no GPU
        assert f"CUDA {healthy.torch_cuda} build) sees none" in p.summary and "nvidia-smi" in p.fix
    else:
        assert "CPU build" in p.summary and healthy.torch_version in p.summary
        assert "make lab CUDA=cu126" in p.fix


def test_pins_match_the_requirements_files() -> None:
    def pins(name: str) -> dict[str, str]:
        text = (REPO / "requirements" / name).read_text()
        return dict(re.findall(r"^([\w.-]+)==([\w.+-]+)", text, re.M))

    assert pins("torch-cpu.txt") == {"torch": env.PINNED_TORCH, "fbgemm-gpu-cpu": env.PINNED_FBGEMM}
    assert pins("torch-cuda.txt") == {"torch": env.PINNED_TORCH, "fbgemm-gpu": env.PINNED_FBGEMM}
    assert pins("torchrec.txt") == {"torchrec": env.PINNED_TORCHREC}
    assert pins("course.txt")["torchmetrics"] == env.PINNED_TORCHMETRICS
    assert pins("constraints.txt")["torchmetrics"] == env.PINNED_TORCHMETRICS


# Measured with torchmetrics 1.9.0 (and the pinned lightning-utilities 0.15.3) beside torchrec 1.8.0.
FROZEN_DATACLASS = "ValueError: A frozen dataclass was passed to `apply_to_collection` but this is not allowed."


def test_a_torchmetrics_that_breaks_torchrec_metrics(healthy: EnvFacts) -> None:
    facts = dataclasses.replace(healthy, torchmetrics_version="1.9.0", rec_metrics_error=FROZEN_DATACLASS)
    p = only(diagnose(facts), "torchrec-metrics-broken")
    assert p.severity == "error"
    assert "torchmetrics 1.9.0" in p.summary and "frozen dataclass" in p.summary
    assert "pip install torchmetrics==1.0.3 -c requirements/constraints.txt" in p.fix
    assert re.search(r"^torchmetrics +1\.9\.0, torchrec\.metrics fails$", str(doctor(facts=facts)), re.M)
    # A torchrec that does not import explains everything downstream: no second problem for its metrics.
    broken = dataclasses.replace(facts, torchrec_import_error="ImportError: x", torchrec_version="1.8.0")
    assert "torchrec-metrics-broken" not in codes(diagnose(broken))


def test_the_metrics_probe_reports_a_failing_compute(monkeypatch: pytest.MonkeyPatch) -> None:
    from torchrec.metrics.ne import NEMetric

    assert env._rec_metrics_error() is None

    def compute(self: object) -> None:
        raise ValueError("A frozen dataclass was passed to `apply_to_collection` but this is not allowed.")

    monkeypatch.setattr(NEMetric, "compute", compute)
    assert env._rec_metrics_error() == FROZEN_DATACLASS


# ------------------------------------------------------------------------------------ broken installs


@pytest.fixture
def cpu_laptop(healthy: EnvFacts) -> EnvFacts:
    """This machine with the CPU build of torch, whichever build it has."""
    return dataclasses.replace(healthy, torch_version="2.13.0+cpu", torch_cuda=None, cuda_available=False,
                               gpu_count=0, nccl_available=False, nccl_version=None)


def test_cuda_fbgemm_pulled_over_a_cpu_torch(cpu_laptop: EnvFacts) -> None:
    facts = dataclasses.replace(
        cpu_laptop, fbgemm_gpu_version="1.8.0", fbgemm_gpu_cpu_version=None,
        fbgemm_import_error=CUDA_FBGEMM_ERROR, torchrec_import_error=CUDA_FBGEMM_ERROR,
    )
    p = only(diagnose(facts), "fbgemm-cuda-on-cpu")  # the import failures are its symptoms, not new problems
    assert "\n" not in p.summary and "\n" not in p.fix
    assert "--no-deps" in p.summary
    assert "pip uninstall -y fbgemm-gpu fbgemm-gpu-cpu" in p.fix
    assert "pip install fbgemm-gpu-cpu==1.8.0" in p.fix
    assert "pip install --no-deps torchrec==1.8.0" in p.fix
    assert "make clean lab" in p.fix


def test_cuda_fbgemm_beside_pypis_torch_without_a_gpu(gpu_node: EnvFacts) -> None:
    """A plain `pip install torch torchrec` on a Linux laptop: PyPI's CUDA torch, the CUDA fbgemm-gpu, no GPU."""
    facts = dataclasses.replace(
        gpu_node, torch_version="2.13.0", torch_cuda="13.0", cuda_available=False, gpu_count=0,
        fbgemm_import_error=CUDA_FBGEMM_ERROR, torchrec_import_error=CUDA_FBGEMM_ERROR,
    )
    p = only(diagnose(facts), "fbgemm-cuda-on-cpu")
    assert "CUDA 13.0 build" in p.summary and "without a GPU" in p.summary and "--no-deps" in p.summary
    assert "pip uninstall -y fbgemm-gpu fbgemm-gpu-cpu" in p.fix and "pip install fbgemm-gpu-cpu==1.8.0" in p.fix
    assert "make clean lab" in p.fix and "CUDA=" not in p.fix
    # where the CUDA fbgemm loads, nothing is wrong on gloo
    assert diagnose(dataclasses.replace(facts, fbgemm_import_error=None, torchrec_import_error=None)) == []


def test_both_fbgemm_distributions_installed(healthy: EnvFacts) -> None:
    facts = dataclasses.replace(healthy, fbgemm_gpu_version="1.8.0", fbgemm_import_error=CUDA_FBGEMM_ERROR)
    p = only(diagnose(facts), "fbgemm-both-installed")
    assert "fbgemm-gpu-cpu==1.8.0" in p.fix and "--no-deps" in p.fix and "uninstall -y" in p.fix
    # Even when the import happens to work, two builds in one site-packages is broken.
    assert codes(diagnose(dataclasses.replace(facts, fbgemm_import_error=None))) == ["fbgemm-both-installed"]


def test_both_fbgemm_on_a_gpu_node_keeps_the_cuda_build(gpu_node: EnvFacts) -> None:
    p = only(diagnose(dataclasses.replace(gpu_node, fbgemm_gpu_cpu_version="1.8.0")), "fbgemm-both-installed")
    assert "download.pytorch.org/whl/cu126 fbgemm-gpu==1.8.0" in p.fix
    assert "make clean lab CUDA=cu126" in p.fix


def test_cpu_fbgemm_with_gpus_is_a_warning(gpu_node: EnvFacts) -> None:
    facts = dataclasses.replace(gpu_node, fbgemm_gpu_version=None, fbgemm_gpu_cpu_version="1.8.0")
    p = only(diagnose(facts), "fbgemm-cpu-on-cuda")
    assert p.severity == "warning" and doctor(facts=facts).ok


def test_fbgemm_missing(healthy: EnvFacts) -> None:
    err = "ModuleNotFoundError: No module named 'fbgemm_gpu'"
    facts = dataclasses.replace(
        healthy, fbgemm_gpu_cpu_version=None, fbgemm_import_error=err, torchrec_import_error=err,
    )
    p = only(diagnose(facts), "fbgemm-missing")
    assert "pip install fbgemm-gpu-cpu==1.8.0" in p.fix


def test_fbgemm_import_failure_not_otherwise_explained(healthy: EnvFacts) -> None:
    err = "RuntimeError: operator fbgemm::jagged_to_padded_dense does not exist\n  (more detail)"
    facts = dataclasses.replace(healthy, fbgemm_import_error=err, torchrec_import_error=err)
    p = only(diagnose(facts), "fbgemm-import-failed")  # torchrec fails because fbgemm does: one root cause
    assert "RuntimeError: operator fbgemm::jagged_to_padded_dense does not exist" in p.summary
    assert "more detail" not in p.summary
    assert "fbgemm-gpu-cpu==1.8.0" in p.fix


def test_torchrec_missing(healthy: EnvFacts) -> None:
    facts = dataclasses.replace(
        healthy, torchrec_version=None, torchrec_import_error="ModuleNotFoundError: No module named 'torchrec'",
    )
    p = only(diagnose(facts), "torchrec-missing")
    assert "pip install --no-deps torchrec==1.8.0" in p.fix


def test_torchrec_import_failed_shows_the_first_line_of_the_error(healthy: EnvFacts) -> None:
    facts = dataclasses.replace(
        healthy, torchrec_import_error="ModuleNotFoundError: No module named 'tensordict'\nTraceback ...",
    )
    p = only(diagnose(facts), "torchrec-import-failed")
    assert p.summary.endswith("ModuleNotFoundError: No module named 'tensordict'")
    assert "pip install tensordict -c requirements/constraints.txt" in p.fix

    facts = dataclasses.replace(healthy, torchrec_import_error="ImportError: cannot import name 'x' from 'y'")
    p = only(diagnose(facts), "torchrec-import-failed")
    assert "cannot import name 'x'" in p.summary and "--no-deps torchrec==1.8.0" in p.fix


def test_torch_missing_explains_everything_after_it(healthy: EnvFacts) -> None:
    err = "ModuleNotFoundError: No module named 'torch'"
    facts = dataclasses.replace(
        healthy, torch_version=None, torch_import_error=err, fbgemm_import_error=err, torchrec_import_error=err,
    )
    p = only(diagnose(facts, backend="nccl", world_size=2), "torch-missing")
    assert "torch==2.13.0" in p.fix and "--no-deps torchrec==1.8.0" in p.fix


# ------------------------------------------------------------------------------------ lockstep


@pytest.mark.parametrize("changes, culprit", [
    ({"torch_version": "2.12.0+cpu", "fbgemm_import_error": UNDEFINED_SYMBOL,
      "torchrec_import_error": UNDEFINED_SYMBOL}, "torch 2.12.0+cpu"),
    ({"fbgemm_gpu_cpu_version": "1.7.0"}, "fbgemm-gpu-cpu 1.7.0"),
    ({"torchrec_version": "1.9.0"}, "torch 2.13.0"),  # 1.9 pairs with torch 2.14 and fbgemm 1.9
])
def test_version_lockstep(healthy: EnvFacts, changes: dict, culprit: str) -> None:
    p = only(diagnose(dataclasses.replace(healthy, **changes)), "version-lockstep")
    assert culprit in p.summary
    assert "torch==2.13.0" in p.fix and "fbgemm-gpu-cpu==1.8.0" in p.fix
    # PyPI's Linux torch==2.13.0 is the CUDA build: a CPU machine's fix must name the CPU index
    assert "--index-url https://download.pytorch.org/whl/cpu" in p.fix
    assert "pip install --no-deps torchrec==1.8.0" in p.fix
    if "fbgemm_import_error" in changes:
        assert "why `import fbgemm_gpu` fails" in p.summary


def test_lockstep_names_what_torchrec_pairs_with(healthy: EnvFacts) -> None:
    p = only(diagnose(dataclasses.replace(healthy, torch_version="2.12.1")), "version-lockstep")
    assert "torchrec 1.8.0" in p.summary and "torch 2.13" in p.summary and "fbgemm 1.8" in p.summary


@pytest.mark.parametrize("torch, fbgemm, torchrec", [
    ("2.13.0+cpu", "1.8.0", "1.8.0"), ("2.13.0", "1.8.1", "1.8.0"), ("2.13.1+cu126", "1.8.0", "1.8.0rc2"),
    ("2.10.0", "1.5.0", "1.5.0"),
])
def test_lockstep_ignores_patch_and_local_labels(healthy: EnvFacts, torch: str, fbgemm: str, torchrec: str) -> None:
    facts = dataclasses.replace(healthy, torch_version=torch, fbgemm_gpu_cpu_version=fbgemm, torchrec_version=torchrec)
    assert "version-lockstep" not in codes(diagnose(facts))


def test_lockstep_without_torchrec_compares_fbgemm_with_torch(healthy: EnvFacts) -> None:
    facts = dataclasses.replace(healthy, torchrec_version=None, fbgemm_gpu_cpu_version="1.7.0")
    assert set(codes(diagnose(facts))) == {"version-lockstep", "torchrec-missing"}


# ------------------------------------------------------------------------------------ NCCL


def test_nccl_on_a_gpu_node(gpu_node: EnvFacts) -> None:
    assert diagnose(gpu_node) == []
    assert diagnose(gpu_node, backend="nccl", world_size=2) == []
    p = only(diagnose(gpu_node, backend="nccl", world_size=4), "nccl-too-few-gpus")
    assert "found 2 GPUs" in p.summary and "gloo" in p.fix


def test_nccl_with_one_gpu_for_two_ranks(gpu_node: EnvFacts) -> None:
    facts = dataclasses.replace(gpu_node, gpu_count=1)
    p = only(diagnose(facts, backend="nccl", world_size=2), "nccl-too-few-gpus")
    assert "found 1 GPU" in p.summary and "world_size=2" in p.summary
    assert 'backend="gloo"' in p.fix and '"auto"' in p.fix


def test_nccl_on_a_cuda_build_without_gpus(gpu_node: EnvFacts) -> None:
    facts = dataclasses.replace(gpu_node, cuda_available=False, gpu_count=0, fbgemm_gpu_version=None,
                                fbgemm_gpu_cpu_version="1.8.0")
    assert diagnose(facts) == []  # a laptop with PyPI's CUDA torch and the CPU fbgemm is fine on gloo
    p = only(diagnose(facts, backend="nccl", world_size=2), "nccl-without-gpu")
    assert "sees none" in p.summary and "gloo" in p.fix


def test_nccl_missing_from_a_cuda_build(gpu_node: EnvFacts) -> None:
    facts = dataclasses.replace(gpu_node, nccl_available=False, nccl_version=None)
    p = only(diagnose(facts, backend="nccl", world_size=2), "nccl-unavailable")
    assert "gloo" in p.fix and "CUDA=cu126" in p.fix


# ------------------------------------------------------------------------------------ python


@pytest.mark.parametrize("version", ["3.11.0", "3.11.2", "3.11.14", "3.12.0", "3.12.4", "3.13.1"])
def test_supported_pythons_are_not_reported(healthy: EnvFacts, version: str) -> None:
    assert "python-version" not in codes(diagnose(dataclasses.replace(healthy, python_version=version)))


def test_other_python_is_a_warning(healthy: EnvFacts) -> None:
    for version in ("3.10.12", "3.14.0"):
        p = only(diagnose(dataclasses.replace(healthy, python_version=version)), "python-version")
        assert p.severity == "warning" and version in p.summary and "PYTHON=python3.12" in p.fix
    facts = dataclasses.replace(healthy, python_version="3.14.0")
    assert doctor(facts=facts).ok
    # errors come before warnings
    broken = dataclasses.replace(facts, torchrec_version=None)
    assert codes(diagnose(broken)) == ["torchrec-missing", "python-version"]


# ------------------------------------------------------------------------------------ the report


def test_report_of_the_healthy_machine(healthy: EnvFacts) -> None:
    report = doctor(facts=healthy)
    assert isinstance(report, Report) and report.ok and report.problems == []
    text = str(report)
    for figure in (healthy.python_version, healthy.torch_version, "fbgemm-gpu-cpu 1.8.0 (CPU build)",
                   healthy.torchrec_version, healthy.torchmetrics_version):
        assert figure in text, (figure, text)
    assert re.search(rf"^CPU cores +{healthy.cpu_count}$", text, re.M), text
    assert "CPU build" in text and "All good" in text and "gloo" in text
    assert repr(report) == text


def test_report_figures_come_from_the_facts(gpu_node: EnvFacts) -> None:
    facts = dataclasses.replace(gpu_node, python_version="3.11.99", cpu_count=96, gpu_count=8)
    text = str(doctor(facts=facts))
    for figure in ("3.11.99", "2.13.0+cu126 (CUDA 12.6 build)", "fbgemm-gpu 1.8.0 (CUDA build)", "8 GPUs",
                   "2.27.5", "96"):
        assert figure in text, (figure, text)


def test_report_lists_each_problem_with_its_fix(healthy: EnvFacts) -> None:
    facts = dataclasses.replace(
        healthy, torch_version="2.12.0+cpu", fbgemm_gpu_version="1.8.0", python_version="3.10.14",
        fbgemm_import_error=CUDA_FBGEMM_ERROR, torchrec_import_error=CUDA_FBGEMM_ERROR,
    )
    report = doctor(backend="nccl", world_size=2, facts=facts)
    assert not report.ok
    assert codes(report.problems) == ["fbgemm-both-installed", "version-lockstep", "nccl-without-gpu",
                                      "python-version"]
    assert "this is why" not in report.problems[1].summary  # the two fbgemm builds may be why, too
    text = str(report)
    assert "All good" not in text
    assert "fbgemm-gpu-cpu 1.8.0 (CPU build) + fbgemm-gpu 1.8.0 (CUDA build), import fails" in text
    for p in report.problems:
        mark = "✗" if p.severity == "error" else "⚠"
        assert f"{mark} {p.summary}\n  fix: {p.fix}" in text


def test_report_pretty_prints_in_ipython(healthy: EnvFacts) -> None:
    from IPython.lib.pretty import pretty

    report = doctor(facts=healthy)
    assert pretty(report) == str(report)


def test_module_runs_as_a_script() -> None:
    run = subprocess.run([sys.executable, "-m", "course_lib.env"], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "All good" in run.stdout and "torchrec" in run.stdout
    assert run.stderr == ""  # the import probes keep library warnings out of the report


def test_main_exits_non_zero_on_an_error(monkeypatch: pytest.MonkeyPatch, healthy: EnvFacts,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(env, "collect_facts", lambda: healthy)
    assert env.main(["--backend", "nccl", "--world-size", "2"]) == 1
    assert "✗ backend='nccl'" in capsys.readouterr().out
    assert env.main([]) == 0


def test_the_report_shows_each_import_error_as_python_printed_it(healthy: EnvFacts) -> None:
    """What a learner pastes into a search box (ERRORS.md lists it) is in the report, first line only."""
    facts = dataclasses.replace(healthy, fbgemm_import_error=UNDEFINED_SYMBOL, torchrec_import_error=CUDA_FBGEMM_ERROR)
    text = str(doctor(facts=facts))
    assert f"import fbgemm_gpu: {UNDEFINED_SYMBOL}" in text
    assert "import torchrec: OSError: Could not load this library" in text and "libcudart" not in text
    assert "import fbgemm_gpu:" not in str(doctor(facts=healthy))
