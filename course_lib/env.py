"""The course's install doctor: what is installed, what works, and what to run when it does not.

    from course_lib import doctor
    doctor()                                  # versions, CPU/CUDA build, GPUs, NCCL, known-bad states
    doctor(backend="nccl", world_size=2)      # ... and whether that group can start here

From a shell: ``python -m course_lib.env [--backend nccl --world-size 2]`` (exit status 1 on an error).

:func:`collect_facts` probes the environment once into an :class:`EnvFacts`; :func:`diagnose` is a pure
function of those facts, so any broken state can be simulated with ``dataclasses.replace(facts, ...)``.

The stack moves in lockstep: torchrec 1.Y needs fbgemm-gpu(-cpu) 1.Y and torch 2.(Y+5). The course pins
torch 2.13.0, fbgemm-gpu-cpu 1.8.0 (fbgemm-gpu 1.8.0 on GPU nodes) and torchrec 1.8.0, and installs
torchrec with ``--no-deps``: a plain ``pip install torchrec`` pulls the CUDA ``fbgemm-gpu`` over
``fbgemm-gpu-cpu``, after which ``import fbgemm_gpu`` fails on a CPU build.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import os
import platform
import re
import sys
import warnings
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "EnvFacts",
    "Problem",
    "Report",
    "collect_facts",
    "diagnose",
    "doctor",
    "PINNED_TORCH",
    "PINNED_FBGEMM",
    "PINNED_TORCHREC",
    "PINNED_TORCHMETRICS",
    "SUPPORTED_PYTHONS",
]

# The course's pins (requirements/torch-cpu.txt, torch-cuda.txt, torchrec.txt; a test keeps them in sync).
PINNED_TORCH = "2.13.0"
PINNED_FBGEMM = "1.8.0"
PINNED_TORCHREC = "1.8.0"
# requirements/course.txt. torchrec 1.8 declares 1.0.3; with 1.9.0 every torchrec.metrics metric fails in compute().
PINNED_TORCHMETRICS = "1.0.3"
# The Pythons every pin has a wheel for (tools/wheels.py asks pip's resolver; tests/test_python_versions.py),
# each from its oldest patch release the lock accepts (soupsieve is held at 2.10 so that 3.11.0-3.11.4 qualify).
SUPPORTED_PYTHONS = {(3, 11): 0, (3, 12): 0, (3, 13): 0}

Severity = Literal["error", "warning"]


@dataclass(frozen=True)
class EnvFacts:
    """Everything the doctor probed about this Python environment.

    Versions are installed distribution versions (``None`` when absent). ``*_import_error`` is ``None``
    when the import works, else ``"ExceptionType: message"``.
    """

    python_version: str
    torch_version: str | None
    torchrec_version: str | None
    fbgemm_gpu_version: str | None  # the CUDA build's distribution, "fbgemm-gpu"
    fbgemm_gpu_cpu_version: str | None  # the CPU build's distribution, "fbgemm-gpu-cpu"
    torch_import_error: str | None
    fbgemm_import_error: str | None
    torchrec_import_error: str | None
    torch_cuda: str | None  # torch.version.cuda: None for a CPU build
    cuda_available: bool
    gpu_count: int
    nccl_available: bool
    nccl_version: str | None
    cpu_count: int | None
    torchmetrics_version: str | None = None
    torchmetrics_wanted: str | None = None  # the version torchrec's metadata pins (``torchmetrics==X``), if any
    # None when torchrec.metrics computes a normalized entropy on a 4-example batch (or torchrec does not
    # import, so it was not tried); else "ExceptionType: message".
    rec_metrics_error: str | None = None

    @property
    def cuda_build(self) -> bool:
        """Whether torch is installed as a CUDA build."""
        return self.torch_version is not None and self.torch_cuda is not None

    @property
    def fbgemm_distribution(self) -> tuple[str, str] | None:
        """The fbgemm distribution in use, as ``(name, version)``; the one that fits the torch build if both are installed."""
        cpu = ("fbgemm-gpu-cpu", self.fbgemm_gpu_cpu_version) if self.fbgemm_gpu_cpu_version else None
        cuda = ("fbgemm-gpu", self.fbgemm_gpu_version) if self.fbgemm_gpu_version else None
        if cpu and cuda:
            return cuda if self.cuda_build and self.gpu_count > 0 else cpu
        return cpu or cuda  # type: ignore[return-value]


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the environment: a stable ``code``, what is wrong, and the command that fixes it."""

    code: str
    summary: str
    fix: str
    severity: Severity = "error"


@dataclass(repr=False)
class Report:
    """What :func:`doctor` found: the facts, the problems, and a readable rendering (``str(report)``)."""

    facts: EnvFacts
    problems: list[Problem] = field(default_factory=list)
    backend: str | None = None
    world_size: int | None = None

    @property
    def ok(self) -> bool:
        """True when no problem is an error (warnings allowed)."""
        return not any(p.severity == "error" for p in self.problems)

    @property
    def errors(self) -> list[Problem]:
        """The error-level problems."""
        return [p for p in self.problems if p.severity == "error"]

    @property
    def warnings(self) -> list[Problem]:
        """The warning-level problems."""
        return [p for p in self.problems if p.severity == "warning"]

    def __str__(self) -> str:
        f = self.facts
        rows = [
            ("Python", f.python_version),
            ("torch", _torch_line(f)),
            ("fbgemm", _fbgemm_line(f)),
            ("torchrec", _torchrec_line(f)),
            ("torchmetrics", (f.torchmetrics_version or "not installed")
             + (", torchrec.metrics fails" if f.rec_metrics_error else "")),
            ("CUDA", _cuda_line(f)),
            ("NCCL", f"available ({f.nccl_version})" if f.nccl_available and f.nccl_version
             else "available" if f.nccl_available else "not available"),
            ("CPU cores", str(f.cpu_count) if f.cpu_count else "unknown"),
        ]
        width = max(len(label) for label, _ in rows) + 2
        lines = [f"{label:<{width}}{value}" for label, value in rows]
        # the import error as Python printed it: what a learner pastes into a search box (ERRORS.md lists it)
        for module, error in (("torch", f.torch_import_error), ("fbgemm_gpu", f.fbgemm_import_error),
                              ("torchrec", f.torchrec_import_error)):
            if error:
                lines.append(f"{'':<{width}}import {module}: {error.strip().splitlines()[0][:160]}")
        if self.ok:
            lines.append(_all_good_line(self))
        for p in self.errors + self.warnings:
            mark = "✗" if p.severity == "error" else "⚠"
            lines.append(f"{mark} {p.summary}\n  fix: {p.fix}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return str(self)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text("Report(...)" if cycle else str(self))


# ---------------------------------------------------------------------------------------------- probing


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except Exception:
        return None


def _pinned_requirement(distribution: str, requirement: str) -> str | None:
    """The version `distribution` pins `requirement` to in its metadata (``requirement==X``), else None."""
    try:
        for line in importlib.metadata.requires(distribution) or []:
            name, _, rest = line.partition("==")
            if name.strip().lower() == requirement and rest:
                return rest.split(";")[0].strip()
    except Exception:
        pass
    return None


def _import_error(module: str) -> str | None:
    """None if ``import module`` works, else "ExceptionType: message" (never raises)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            importlib.import_module(module)
    except Exception as e:  # OSError (a .so that does not load), ImportError, RuntimeError, ...
        return f"{type(e).__name__}: {e}"
    return None


def collect_facts() -> EnvFacts:
    """Probe this environment: versions, whether the stack imports, the torch build, GPUs, NCCL, cores.

    Never raises. Imports torch, fbgemm_gpu and torchrec (a few seconds the first time in a process).
    """
    torch_import_error = _import_error("torch")
    torch_cuda: str | None = None
    cuda_available = False
    gpu_count = 0
    nccl_available = False
    nccl_version: str | None = None
    if torch_import_error is None:
        import torch

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a broken driver warns from is_available(); the facts say it
            try:
                torch_cuda = torch.version.cuda
            except Exception:
                pass
            try:
                cuda_available = bool(torch.cuda.is_available())
                gpu_count = int(torch.cuda.device_count()) if cuda_available else 0
            except Exception:
                cuda_available, gpu_count = False, 0
            try:
                import torch.distributed as dist

                nccl_available = bool(dist.is_available() and dist.is_nccl_available())
            except Exception:
                nccl_available = False
            if nccl_available:
                try:
                    v = torch.cuda.nccl.version()
                    nccl_version = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
                except Exception:
                    nccl_version = None
    fbgemm_import_error = _import_error("fbgemm_gpu")
    torchrec_import_error = _import_error("torchrec")
    rec_metrics_error = _rec_metrics_error() if torchrec_import_error is None else None
    return EnvFacts(
        python_version=platform.python_version(),
        torch_version=_dist_version("torch"),
        torchrec_version=_dist_version("torchrec"),
        fbgemm_gpu_version=_dist_version("fbgemm-gpu"),
        fbgemm_gpu_cpu_version=_dist_version("fbgemm-gpu-cpu"),
        torch_import_error=torch_import_error,
        fbgemm_import_error=fbgemm_import_error,
        torchrec_import_error=torchrec_import_error,
        torch_cuda=torch_cuda,
        cuda_available=cuda_available,
        gpu_count=gpu_count,
        nccl_available=nccl_available,
        nccl_version=nccl_version,
        cpu_count=os.cpu_count(),
        torchmetrics_version=_dist_version("torchmetrics"),
        torchmetrics_wanted=_pinned_requirement("torchrec", "torchmetrics"),
        rec_metrics_error=rec_metrics_error,
    )


def _rec_metrics_error() -> str | None:
    """None if a torchrec.metrics metric computes (one process, no group), else "ExceptionType: message"."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import torch
            from torchrec.metrics.metrics_config import RecComputeMode, RecTaskInfo
            from torchrec.metrics.ne import NEMetric

            metric = NEMetric(
                world_size=1, my_rank=0, batch_size=4, tasks=[RecTaskInfo(name="probe")],
                compute_mode=RecComputeMode.UNFUSED_TASKS_COMPUTATION, window_size=8,
            )
            metric.update(
                predictions={"probe": torch.tensor([0.2, 0.8, 0.5, 0.1])},
                labels={"probe": torch.tensor([0.0, 1.0, 1.0, 0.0])},
                weights={"probe": torch.ones(4)},
            )
            metric.compute()
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return None


# ---------------------------------------------------------------------------------------------- diagnosis


def _major_minor(version: str | None) -> tuple[int, int] | None:
    """(major, minor) of a version string, ignoring patch and local labels ("2.13.0+cpu" -> (2, 13))."""
    if not version:
        return None
    m = re.match(r"\s*(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _torch_for(stack: tuple[int, int]) -> tuple[int, int] | None:
    """The torch (major, minor) that fbgemm/torchrec ``stack`` pairs with; None where the rule is unknown."""
    major, minor = stack
    return (2, minor + 5) if major == 1 else None


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text


def _cuda_tag(facts: EnvFacts) -> str:
    """The PyTorch wheel index tag for this build's CUDA ("12.6" -> "cu126"); cu126 when unknown."""
    mm = _major_minor(facts.torch_cuda)
    return f"cu{mm[0]}{mm[1]}" if mm else "cu126"


def _wants_cuda_fbgemm(facts: EnvFacts) -> bool:
    return facts.cuda_build and facts.gpu_count > 0


def _rebuild(facts: EnvFacts) -> str:
    """The make command that rebuilds .venv with the course's pins for this machine."""
    return f"make clean lab CUDA={_cuda_tag(facts)}" if _wants_cuda_fbgemm(facts) else "make clean lab"


def _fbgemm_install(facts: EnvFacts) -> str:
    if _wants_cuda_fbgemm(facts):
        return (f"pip install --index-url https://download.pytorch.org/whl/{_cuda_tag(facts)} "
                f"fbgemm-gpu=={PINNED_FBGEMM}")
    return f"pip install fbgemm-gpu-cpu=={PINNED_FBGEMM}"


def _stack_install(facts: EnvFacts) -> str:
    """pip commands that install the pinned torch / fbgemm / torchrec triple for this machine."""
    if _wants_cuda_fbgemm(facts):
        first = (f"pip install --index-url https://download.pytorch.org/whl/{_cuda_tag(facts)} "
                 f"--extra-index-url https://pypi.org/simple torch=={PINNED_TORCH} fbgemm-gpu=={PINNED_FBGEMM}")
    else:
        # PyPI's Linux torch is the CUDA build: the CPU build lives on the PyTorch CPU index (macOS wheels too)
        first = (f"pip install --index-url https://download.pytorch.org/whl/cpu --extra-index-url https://pypi.org/simple "
                 f"torch=={PINNED_TORCH} fbgemm-gpu-cpu=={PINNED_FBGEMM}")
    return f"{first} && pip install --no-deps torchrec=={PINNED_TORCHREC}"


def _fbgemm_problems(facts: EnvFacts) -> list[Problem]:
    cuda, cpu = facts.fbgemm_gpu_version, facts.fbgemm_gpu_cpu_version
    swap = "pip uninstall -y fbgemm-gpu fbgemm-gpu-cpu && {install} && pip install --no-deps torchrec=={tr}"
    if cuda and cpu:
        keep = "fbgemm-gpu" if _wants_cuda_fbgemm(facts) else "fbgemm-gpu-cpu"
        return [Problem(
            "fbgemm-both-installed",
            f"both fbgemm-gpu {cuda} (CUDA) and fbgemm-gpu-cpu {cpu} are installed and overwrite each other's "
            f"files; keep only {keep} (plain `pip install torchrec` pulls fbgemm-gpu)",
            swap.format(install=_fbgemm_install(facts), tr=PINNED_TORCHREC) + f" (or `{_rebuild(facts)}`, which rebuilds .venv)",
        )]
    if cuda and facts.torch_version and not facts.cuda_build:
        return [Problem(
            "fbgemm-cuda-on-cpu",
            f"the CUDA fbgemm-gpu {cuda} is installed on a CPU build of torch ({facts.torch_version}), "
            f"{'so `import fbgemm_gpu` fails' if facts.fbgemm_import_error else 'where it cannot load'} "
            "(plain `pip install torchrec` pulls it; install torchrec with --no-deps)",
            swap.format(install=_fbgemm_install(facts), tr=PINNED_TORCHREC) + f" (or `{_rebuild(facts)}`, which rebuilds .venv)",
        )]
    if cuda and facts.torch_version and facts.fbgemm_import_error and not _wants_cuda_fbgemm(facts):
        # PyPI's torch on a machine without a GPU (a plain `pip install torch` on Linux): a CUDA build, and the CUDA
        # fbgemm-gpu that `pip install torchrec` pulled does not load beside it; the CPU fbgemm does.
        return [Problem(
            "fbgemm-cuda-on-cpu",
            f"the CUDA fbgemm-gpu {cuda} is installed beside torch {facts.torch_version} (CUDA {facts.torch_cuda} "
            "build) on a machine without a GPU, and `import fbgemm_gpu` fails (plain `pip install torchrec` pulls it; "
            "install torchrec with --no-deps)",
            swap.format(install=_fbgemm_install(facts), tr=PINNED_TORCHREC) + f" (or `{_rebuild(facts)}`, which rebuilds .venv)",
        )]
    if cpu and _wants_cuda_fbgemm(facts):
        return [Problem(
            "fbgemm-cpu-on-cuda",
            f"fbgemm-gpu-cpu {cpu} is installed with a CUDA build of torch and {facts.gpu_count} GPU(s): "
            "embedding tables cannot run on the GPUs",
            swap.format(install=_fbgemm_install(facts), tr=PINNED_TORCHREC) + f" (or `{_rebuild(facts)}`)",
            "warning",
        )]
    if not cuda and not cpu:
        return [Problem(
            "fbgemm-missing",
            "neither fbgemm-gpu-cpu nor fbgemm-gpu is installed: torchrec needs one",
            f"{_fbgemm_install(facts)} (or `{_rebuild(facts)}`)",
        )]
    return []


def _lockstep_problem(facts: EnvFacts, failures_explained: bool) -> Problem | None:
    fb = facts.fbgemm_distribution
    torch_mm = _major_minor(facts.torch_version)
    fbgemm_mm = _major_minor(fb[1]) if fb else None
    torchrec_mm = _major_minor(facts.torchrec_version)
    ref = torchrec_mm or fbgemm_mm  # torchrec decides what the others must be; fbgemm when it is absent
    if ref is None:
        return None
    want_torch = _torch_for(ref)
    wrong: list[str] = []
    if torchrec_mm and fbgemm_mm and fbgemm_mm != torchrec_mm:
        wrong.append(f"{fb[0]} {fb[1]}")  # type: ignore[index]
    if torch_mm and want_torch and torch_mm != want_torch:
        wrong.append(f"torch {facts.torch_version}")
    if not wrong:
        return None
    if torchrec_mm:
        basis = f"torchrec {facts.torchrec_version}"
        needs = f"torch {want_torch[0]}.{want_torch[1]} and fbgemm {ref[0]}.{ref[1]}" if want_torch else \
            f"fbgemm {ref[0]}.{ref[1]}"
    else:
        basis = f"{fb[0]} {fb[1]}"  # type: ignore[index]
        needs = f"torch {want_torch[0]}.{want_torch[1]}"  # type: ignore[index]
    failing = [m for m, err in (("fbgemm_gpu", facts.fbgemm_import_error), ("torchrec", facts.torchrec_import_error)) if err]
    why = f"; this is why `import {failing[0]}` fails" if failing and not failures_explained else ""
    return Problem(
        "version-lockstep",
        f"{' and '.join(wrong)} {'is' if len(wrong) == 1 else 'are'} out of lockstep with {basis} (it pairs with {needs}){why}",
        f"{_stack_install(facts)} (the course's pins; or `{_rebuild(facts)}`, which rebuilds .venv)",
    )


def _torchrec_import_fix(error: str) -> str:
    missing = re.search(r"No module named '([\w.]+)'", error)
    if missing and not missing.group(1).startswith(("torchrec", "fbgemm_gpu", "torch")):
        dist = missing.group(1).split(".")[0].replace("_", "-")
        return (f"pip install {dist} -c requirements/constraints.txt (a torchrec dependency that "
                f"--no-deps skips; `make clean lab` installs them all)")
    return f"pip install --force-reinstall --no-deps torchrec=={PINNED_TORCHREC} (or `make clean lab`, which rebuilds .venv)"


def _nccl_problems(facts: EnvFacts, world_size: int | None) -> list[Problem]:
    gloo = 'backend="gloo" (or "auto", which picks gloo without enough GPUs)'
    gpu_node = "make lab CUDA=cu126"
    if not facts.cuda_build:
        return [Problem(
            "nccl-without-gpu",
            f"backend='nccl' needs CUDA GPUs, but this torch ({facts.torch_version}) is a CPU build",
            f"use {gloo}; or run on a GPU node set up with `{gpu_node}`",
        )]
    if not facts.cuda_available or facts.gpu_count == 0:
        return [Problem(
            "nccl-without-gpu",
            f"backend='nccl' needs CUDA GPUs, but torch (CUDA {facts.torch_cuda} build) sees none",
            f"use {gloo}; or run on a GPU node (check `nvidia-smi` and CUDA_VISIBLE_DEVICES)",
        )]
    if not facts.nccl_available:
        return [Problem(
            "nccl-unavailable",
            f"backend='nccl' requested, but this torch build ({facts.torch_version}) has no NCCL",
            f"use {gloo}; or rebuild on a Linux GPU node with `make clean lab CUDA={_cuda_tag(facts)}`",
        )]
    if world_size is not None and world_size > facts.gpu_count:
        s = "" if facts.gpu_count == 1 else "s"
        return [Problem(
            "nccl-too-few-gpus",
            f"backend='nccl' with world_size={world_size} needs {world_size} GPUs (one per rank); "
            f"found {facts.gpu_count} GPU{s}",
            f"use world_size<={facts.gpu_count}, or {gloo} for {world_size} ranks",
        )]
    return []


def diagnose(facts: EnvFacts, backend: str | None = None, world_size: int | None = None) -> list[Problem]:
    """The problems in ``facts``, one per root cause, errors before warnings (a pure function).

    ``backend`` and ``world_size`` describe the process group about to be started; NCCL problems are only
    reported when ``backend == "nccl"``.
    """
    problems: list[Problem] = []
    if facts.torch_version is None:
        problems.append(Problem(
            "torch-missing", "torch is not installed",
            f"{_stack_install(facts)} (or `{_rebuild(facts)}`)",
        ))
    elif facts.torch_import_error:
        problems.append(Problem(
            "torch-import-failed", f"`import torch` fails: {_first_line(facts.torch_import_error)}",
            f"pip install --force-reinstall torch=={PINNED_TORCH} (or `{_rebuild(facts)}`, which rebuilds .venv)",
        ))
    torch_ok = facts.torch_version is not None and not facts.torch_import_error

    fbgemm = _fbgemm_problems(facts)
    problems += fbgemm
    fbgemm_explained = any(p.severity == "error" for p in fbgemm)
    lockstep = _lockstep_problem(facts, failures_explained=not torch_ok or fbgemm_explained)
    if lockstep:
        problems.append(lockstep)
    # An import failure is reported on its own only when nothing above explains it.
    explained = not torch_ok or lockstep is not None or fbgemm_explained
    fbgemm_failed = facts.fbgemm_import_error is not None
    if fbgemm_failed and not explained:
        problems.append(Problem(
            "fbgemm-import-failed", f"`import fbgemm_gpu` fails: {_first_line(facts.fbgemm_import_error)}",  # type: ignore[arg-type]
            f"pip install --force-reinstall --no-deps {_fbgemm_install(facts).split()[-1]} "
            f"(or `{_rebuild(facts)}`, which rebuilds .venv)",
        ))

    if facts.torchrec_version is None:
        problems.append(Problem(
            "torchrec-missing", "torchrec is not installed",
            f"pip install --no-deps torchrec=={PINNED_TORCHREC} (with --no-deps: plain `pip install torchrec` "
            f"pulls the CUDA fbgemm-gpu; or `{_rebuild(facts)}`)",
        ))
    elif facts.torchrec_import_error and not explained and not fbgemm_failed:
        problems.append(Problem(
            "torchrec-import-failed", f"`import torchrec` fails: {_first_line(facts.torchrec_import_error)}",
            _torchrec_import_fix(facts.torchrec_import_error),
        ))

    if facts.rec_metrics_error and facts.torchrec_version is not None and not facts.torchrec_import_error:
        have = f"torchmetrics {facts.torchmetrics_version}" if facts.torchmetrics_version else "this torchmetrics"
        problems.append(Problem(
            "torchrec-metrics-broken",
            f"torchrec.metrics fails with {have} (lab 04's RecMetricModule needs it): "
            f"{_first_line(facts.rec_metrics_error)}",
            f"pip install torchmetrics=={PINNED_TORCHMETRICS} -c requirements/constraints.txt "
            f"(the version torchrec {PINNED_TORCHREC} declares; or `{_rebuild(facts)}`)",
        ))
    # a version other than torchrec's own that has not (yet) failed the probe: a warning
    wanted = facts.torchmetrics_wanted
    if not facts.rec_metrics_error and facts.torchrec_version and facts.torchmetrics_version and wanted and facts.torchmetrics_version != wanted:
        problems.append(Problem(
            "torchmetrics-version",
            f"torchmetrics {facts.torchmetrics_version} is installed, torchrec {facts.torchrec_version} declares "
            f"torchmetrics=={wanted}: torchrec imports, but its metrics (torchrec.metrics: NE, AUC, "
            "RecMetricModule) can fail in compute() (with 1.9.0: \"A frozen dataclass was passed to "
            "apply_to_collection\")",
            f"pip install torchmetrics=={wanted} (or `{_rebuild(facts)}`, which rebuilds .venv)",
            "warning",
        ))

    if backend == "nccl" and torch_ok:
        problems += _nccl_problems(facts, world_size)

    py = _major_minor(facts.python_version)
    patch = facts.python_version.split(".")[2] if facts.python_version.count(".") >= 2 else ""
    lowest = SUPPORTED_PYTHONS.get(py) if py is not None else None
    if py is not None and (lowest is None or (patch.isdigit() and int(patch) < lowest)):
        problems.append(Problem(
            "python-version",
            f"Python {facts.python_version}: the course's pinned wheels exist for CPython 3.11, 3.12 "
            "and 3.13",
            "build .venv with one of them: `make clean lab PYTHON=python3.12` (or python3.11 / python3.13)",
            "warning",
        ))
    return [p for p in problems if p.severity == "error"] + [p for p in problems if p.severity == "warning"]


def doctor(backend: str | None = None, world_size: int | None = None, facts: EnvFacts | None = None) -> Report:
    """Check this environment (or the given ``facts``) and return a :class:`Report`; prints nothing.

    Pass the ``backend`` and ``world_size`` you are about to launch with to check them too.
    """
    facts = collect_facts() if facts is None else facts
    return Report(facts, diagnose(facts, backend, world_size), backend, world_size)


# ---------------------------------------------------------------------------------------------- rendering


def _torch_line(f: EnvFacts) -> str:
    if f.torch_version is None:
        return "not installed"
    build = f"CUDA {f.torch_cuda} build" if f.torch_cuda else "CPU build"
    return f"{f.torch_version} ({build})" + (", import fails" if f.torch_import_error else "")


def _fbgemm_line(f: EnvFacts) -> str:
    dists = []
    if f.fbgemm_gpu_cpu_version:
        dists.append(f"fbgemm-gpu-cpu {f.fbgemm_gpu_cpu_version} (CPU build)")
    if f.fbgemm_gpu_version:
        dists.append(f"fbgemm-gpu {f.fbgemm_gpu_version} (CUDA build)")
    if not dists:
        return "not installed"
    return " + ".join(dists) + (", import fails" if f.fbgemm_import_error else "")


def _torchrec_line(f: EnvFacts) -> str:
    if f.torchrec_version is None:
        return "not installed"
    return f.torchrec_version + (", import fails" if f.torchrec_import_error else "")


def _cuda_line(f: EnvFacts) -> str:
    if f.cuda_available:
        return f"available, {f.gpu_count} GPU{'' if f.gpu_count == 1 else 's'}"
    return "not available (0 GPUs)"


def _all_good_line(report: Report) -> str:
    f = report.facts
    if report.backend is not None:
        ranks = f" with world_size={report.world_size}" if report.world_size is not None else ""
        where = f"backend={report.backend!r}{ranks} can start here"
    elif f.cuda_available and f.gpu_count > 0 and f.nccl_available:
        where = f"backend='nccl' can use up to {f.gpu_count} rank{'' if f.gpu_count == 1 else 's'} here"
    else:
        where = "use backend='gloo' here (no CUDA GPU)"
    note = f" ({len(report.warnings)} warning{'' if len(report.warnings) == 1 else 's'} below)" if report.warnings else ""
    return f"All good: torch, fbgemm and torchrec import and are in lockstep; {where}.{note}"


def main(argv: list[str] | None = None) -> int:
    """``python -m course_lib.env``: print the report; exit status 1 when it has an error."""
    parser = argparse.ArgumentParser(prog="python -m course_lib.env", description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["gloo", "nccl", "auto"], default=None,
                        help="check that a group with this backend can start here")
    parser.add_argument("--world-size", type=int, default=None, help="number of ranks to check for")
    args = parser.parse_args(argv)
    try:
        sys.stdout.reconfigure(errors="replace")  # type: ignore[union-attr]  # ✗ on a non-UTF-8 terminal
    except Exception:
        pass
    report = doctor(args.backend, args.world_size)
    print(report)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
