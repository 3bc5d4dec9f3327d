"""Checks for 00_setup: read broken install reports (the check hands the learner's function reports it has not seen), decide what to install on a machine (the check installs
it in simulation and re-runs the doctor), and run a first process group.

Every machine below is an :class:`EnvFacts` that the course's own probe, :func:`course_lib.env.collect_facts`,
could return on some machine: :func:`impossible` lists the rules that probe obeys, and :func:`_machine` builds
each case through it (a doctor report of a machine no doctor would see teaches the wrong reading)."""
from __future__ import annotations

import re
import warnings
from dataclasses import replace
from typing import Any, Callable, Mapping

from course_lib.checks import CheckFailed, checked_call, exercise, fail, one_line, passed
from course_lib.env import PINNED_FBGEMM, PINNED_TORCH, PINNED_TORCHMETRICS, PINNED_TORCHREC, EnvFacts, Report, _major_minor, _torch_for, doctor

# What collect_facts records for an import that fails: "ExceptionType: message" (course_lib.env._import_error).
_ERROR = re.compile(r"^[A-Za-z_][\w.]*: \S")
# A torch, fbgemm_gpu or torchrec import that fails because a shared library does not load. torch's
# `torch.ops.load_library` raises OSError(f"Could not load this library: {path}") whatever the loader said (an
# undefined symbol, a missing libcudart), and fbgemm_gpu loads fbgemm_gpu_config.so first; `import torchrec`
# imports fbgemm_gpu, so it fails with the same error (measured with an fbgemm_gpu that raises on import).
LOAD_ERROR = "OSError: Could not load this library: .../site-packages/fbgemm_gpu/fbgemm_gpu_config.so"
# The NCCL a CUDA build of torch bundles (torch.cuda.nccl.version() reads it from the build, GPUs or not).
TORCH_NCCL = "2.27.5"


def _missing(module: str) -> str:
    return f"ModuleNotFoundError: No module named '{module}'"


def impossible(facts: EnvFacts) -> list[str]:
    """Why `collect_facts` could not have returned `facts` on any machine (empty when it could): the rules its
    probing obeys. A CPU build of torch has ``torch.version.cuda = None``, no NCCL and no GPUs;
    ``torch.cuda.device_count()`` is only read when ``is_available()``; a package that is not installed fails
    to import with ModuleNotFoundError; fbgemm_gpu and torchrec import torch, and torchrec imports fbgemm_gpu, so
    their imports fail when those fail; torchrec.metrics is only probed when torchrec imports."""
    f = facts
    why: list[str] = []
    for name, error in (("torch", f.torch_import_error), ("fbgemm_gpu", f.fbgemm_import_error),
                        ("torchrec", f.torchrec_import_error), ("torchrec.metrics", f.rec_metrics_error)):
        if error is not None and not _ERROR.match(error):
            why.append(f"{name}'s import error {error!r} is not 'ExceptionType: message'")
    if f.torch_version is None and f.torch_import_error != _missing("torch"):
        why.append("torch is not installed, so `import torch` fails with ModuleNotFoundError")
    if f.torch_import_error is not None:
        if f.torch_cuda is not None or f.cuda_available or f.gpu_count or f.nccl_available or f.nccl_version:
            why.append("`import torch` fails, so nothing about CUDA, GPUs or NCCL can be read")
        if f.fbgemm_import_error is None or f.torchrec_import_error is None:
            why.append("`import torch` fails, so fbgemm_gpu and torchrec (which import torch) fail too")
    tag = (f.torch_version or "").partition("+")[2]
    if f.torch_import_error is None and tag == "cpu" and f.torch_cuda is not None:
        why.append(f"torch {f.torch_version} is a CPU build: torch.version.cuda is None, not {f.torch_cuda!r}")
    if f.torch_import_error is None and re.fullmatch(r"cu\d\d\d+", tag) and f.torch_cuda != f"{tag[2:-1]}.{tag[-1]}":
        why.append(f"torch {f.torch_version} is a CUDA {tag[2:-1]}.{tag[-1]} build, not torch_cuda={f.torch_cuda!r}")
    if f.torch_cuda is None and (f.cuda_available or f.gpu_count or f.nccl_available):
        why.append("a CPU build of torch sees no CUDA GPU and has no NCCL")
    if f.cuda_available != (f.gpu_count > 0) or f.gpu_count < 0:
        why.append(f"cuda_available={f.cuda_available} with gpu_count={f.gpu_count}: the count is read only when "
                   "CUDA is available, and CUDA is available only with a GPU")
    if f.nccl_version is not None and not f.nccl_available:
        why.append("an NCCL version is only read when NCCL is available")
    if f.fbgemm_gpu_version is None and f.fbgemm_gpu_cpu_version is None and f.fbgemm_import_error is None:
        why.append("no fbgemm distribution is installed, so `import fbgemm_gpu` fails")
    if f.torchrec_version is None:
        if f.torchrec_import_error != _missing("torchrec"):
            why.append("torchrec is not installed, so `import torchrec` fails with ModuleNotFoundError")
        if f.torchmetrics_wanted is not None:
            why.append("torchmetrics_wanted is read from torchrec's metadata: no torchrec, no pin")
    elif f.fbgemm_import_error is not None and f.torchrec_import_error is None:
        why.append("`import torchrec` imports fbgemm_gpu, so it fails when `import fbgemm_gpu` fails")
    if f.torchrec_import_error is not None and f.rec_metrics_error is not None:
        why.append("torchrec.metrics is only probed when `import torchrec` works")
    if f.torchrec_import_error is None and f.torchmetrics_version is None and f.rec_metrics_error is None:
        why.append("torchrec imports but torchmetrics is not installed: the torchrec.metrics probe fails")
    if not re.fullmatch(r"\d+\.\d+\.\d+\w*", f.python_version) or (f.cpu_count is not None and f.cpu_count < 1):
        why.append("python_version and cpu_count come from platform.python_version() and os.cpu_count()")
    return why


def _machine(base: EnvFacts, **changes: Any) -> EnvFacts:
    """`base` with `changes`: a machine the doctor could see (AssertionError otherwise)."""
    facts = replace(base, **changes)
    problems = impossible(facts)
    assert not problems, f"no doctor would report this machine: {problems}"
    return facts


# A healthy CPU laptop with the course's pins (what collect_facts reports on the course's own laptop), from which
# the broken states below are derived.
HEALTHY_LAPTOP = _machine(EnvFacts(
    python_version="3.11.7",
    torch_version="2.13.0+cpu",
    torchrec_version="1.8.0",
    fbgemm_gpu_version=None,
    fbgemm_gpu_cpu_version="1.8.0",
    torch_import_error=None,
    fbgemm_import_error=None,
    torchrec_import_error=None,
    torch_cuda=None,
    cuda_available=False,
    gpu_count=0,
    nccl_available=False,
    nccl_version=None,
    cpu_count=2,
    torchmetrics_version=PINNED_TORCHMETRICS,
    torchmetrics_wanted=PINNED_TORCHMETRICS,
))

FIXES: dict[int, str] = {
    1: "pip install torchrec==1.8.0   (reinstall torchrec the usual way)",
    2: "pip uninstall -y fbgemm-gpu && pip install fbgemm-gpu-cpu==1.8.0, then torchrec with --no-deps",
    3: "pip install torch==2.13.0 from the PyTorch CPU index   (the torch release that fbgemm 1.8 and torchrec 1.8 pair with)",
    4: "install the NVIDIA driver and CUDA 12.6",
    5: "launch(..., backend='gloo')   (or backend='auto')",
    6: "pip install --upgrade torchrec   (the newest torchrec)",
}

_RIGHT = {"fbgemm-cuda-on-cpu": 2, "version-lockstep": 3, "nccl-without-gpu": 5}
_HINTS = {
    1: "a plain `pip install torchrec` is how this state usually arises: it pulls fbgemm-gpu, the CUDA build",
    4: "a driver does not give a laptop a GPU; which backend runs collectives on CPUs?",
    6: "the newest torchrec pairs with an even newer torch: the versions must move together",
}
# A right fix number for another diagnosis: what the learner's reading missed, by (diagnosis, fix chosen).
_MISREAD = {
    ("version-lockstep", 2): "it ends in the same import error as a wrong fbgemm build, but the ✗ line under it names "
                             "what is out of step: a torch release",
    ("fbgemm-cuda-on-cpu", 3): "the ✗ line names a build of fbgemm that cannot load here, not a torch release",
    ("nccl-without-gpu", 2): "this install imports fine: the ✗ line is about the backend the group asks for",
    ("nccl-without-gpu", 3): "this install imports fine: the ✗ line is about the backend the group asks for",
    ("fbgemm-cuda-on-cpu", 5): "this report asks for no backend: the install itself is broken",
    ("version-lockstep", 5): "this report asks for no backend: the install itself is broken",
}


def broken_reports() -> dict[str, Report]:
    """Three doctor() reports of broken setups, simulated from a healthy laptop."""
    cuda_fbgemm = _machine(
        HEALTHY_LAPTOP, fbgemm_gpu_version="1.8.0", fbgemm_gpu_cpu_version=None,
        fbgemm_import_error=LOAD_ERROR, torchrec_import_error=LOAD_ERROR,
    )
    old_torch = _machine(
        HEALTHY_LAPTOP, torch_version="2.12.0+cpu", fbgemm_import_error=LOAD_ERROR, torchrec_import_error=LOAD_ERROR,
    )
    return {
        "A": doctor(facts=cuda_fbgemm),
        "B": doctor(facts=old_torch),
        "C": doctor(backend="nccl", world_size=2, facts=HEALTHY_LAPTOP),
    }


# The torch a plain `pip install torch` brings on Linux: PyPI's CUDA build, NCCL bundled, on a laptop with no GPU.
_PYPI_TORCH = dict(torch_version="2.13.0+cu126", torch_cuda="12.6", nccl_available=True, nccl_version=TORCH_NCCL)


def unseen_reports() -> dict[str, Report]:
    """Three more reports, simulated as :func:`broken_reports` are, that the lab does not show: the same three
    diagnoses with other versions, builds and rows (a newer torch, PyPI's CUDA torch on a laptop, 4 ranks), so
    that a function must read the diagnosis, not recognise a report it has seen."""
    return {
        "a laptop with torch 2.14": doctor(facts=_machine(
            HEALTHY_LAPTOP, torch_version="2.14.0+cpu", fbgemm_import_error=LOAD_ERROR, torchrec_import_error=LOAD_ERROR,
        )),
        "a laptop with PyPI's CUDA torch and the CUDA fbgemm": doctor(facts=_machine(
            HEALTHY_LAPTOP, **_PYPI_TORCH, fbgemm_gpu_version="1.8.0", fbgemm_gpu_cpu_version=None,
            fbgemm_import_error=LOAD_ERROR, torchrec_import_error=LOAD_ERROR, cpu_count=8,
        )),
        "a laptop with PyPI's CUDA torch, asked for 4 NCCL ranks": doctor(
            backend="nccl", world_size=4, facts=_machine(HEALTHY_LAPTOP, **_PYPI_TORCH, cpu_count=4),
        ),
    }


def _reports_to_read() -> list[tuple[str, Report]]:
    """What check_fix_for hands fix_for, in its order: the lab's reports and the unseen ones, interleaved."""
    shown = broken_reports()
    unseen = [(f"the report of {name} (not shown in the lab)", report) for name, report in unseen_reports().items()]
    return [unseen[0], ("report C", shown["C"]), unseen[1], ("report A", shown["A"]), unseen[2], ("report B", shown["B"])]


def _diagnosis(report: Report) -> str:
    return next(line for line in str(report).splitlines() if line.startswith("✗"))


@exercise
def check_fix_for(fix_for: Callable[[str], int]) -> None:
    """Call ``fix_for(str(report))`` on reports A, B and C and on three reports the lab does not show, in
    another order; each call must return the number of the fix in FIXES that cures that report's laptop."""
    for where, report in _reports_to_read():
        try:
            choice = checked_call("fix_for", fix_for, str(report))
        except CheckFailed:
            raise
        except Exception as error:  # noqa: BLE001  (the learner's code: say where it failed)
            fail(f"fix_for raised {one_line(error)[:100]} on {where}",
                 "read the report's ✗ line, the doctor's diagnosis: every report has one, with its own versions")
        if isinstance(choice, bool) or not isinstance(choice, int) or choice not in FIXES:
            kind = "" if isinstance(choice, int) and not isinstance(choice, bool) else f" ({type(choice).__name__})"
            fail(f"{where}: fix_for returned {choice!r}{kind}, not one of the fix numbers {sorted(FIXES)}",
                 "return the number of one fix on the menu, as an int")
        code = report.problems[0].code
        if choice != _RIGHT[code]:
            hint = _HINTS.get(choice) or _MISREAD.get((code, choice),
                                                       "read the report's ✗ line: what does it say is wrong, and with what?")
            fail(f"{where}: fix {choice} does not cure it. Its diagnosis: {_diagnosis(report)[2:]}", hint)
    passed("fix_for reads the diagnosis: the right fix for reports A, B and C and for 3 reports the lab does not show")


# ------------------------------------------------------------------------- exercise 2: fix and re-run

GPU_NODE = _machine(
    HEALTHY_LAPTOP,
    torch_version="2.13.0+cu126",
    torch_cuda="12.6",
    fbgemm_gpu_version="1.8.0",
    fbgemm_gpu_cpu_version=None,
    cuda_available=True,
    gpu_count=8,
    nccl_available=True,
    nccl_version=TORCH_NCCL,
    cpu_count=96,
)
PACKAGES = ("torch", "fbgemm-gpu", "fbgemm-gpu-cpu", "torchrec")
# The torch builds the simulation installs, by their local tag: the CPU build (PyPI's CPU index) and the CUDA 12.6
# build the course's GPU nodes get (make lab CUDA=cu126, requirements/torch-cuda.txt). A tag outside these is no
# build the course installs or has tested, and the simulation does not make one up from its name (cu118 is not
# "CUDA 11.8, so it works": pip finds no such build of the pinned torch).
TORCH_BUILDS = ("cpu", "cu126")


def broken_machines() -> dict[str, EnvFacts]:
    """Broken installs to repair, by label: laptops A and B of exercise 1, a laptop with the newest torchrec (D),
    and two 8-GPU nodes (E, F)."""
    reports = broken_reports()
    return {
        "A (laptop)": reports["A"].facts,
        "B (laptop)": reports["B"].facts,
        # torchrec is pure Python: a release ahead of its fbgemm may well import; the doctor still flags it
        "D (laptop, newest torchrec)": _machine(HEALTHY_LAPTOP, torchrec_version="1.9.0"),
        "E (GPU node, CPU fbgemm)": _machine(GPU_NODE, fbgemm_gpu_version=None, fbgemm_gpu_cpu_version="1.8.0"),
        "F (GPU node, old torch)": _machine(
            GPU_NODE, torch_version="2.12.1+cu126", fbgemm_import_error=LOAD_ERROR, torchrec_import_error=LOAD_ERROR,
        ),
    }


def _fresh_machines() -> dict[str, EnvFacts]:
    """Three more broken machines the check repairs after :func:`broken_machines`, not shown in the lab: a plan
    must follow from the facts (GPUs or none), not from the torch build a machine happens to have (G's CUDA
    torch has NCCL but sees no GPU), nor from the lab's 8-GPU nodes or several GPUs (I has one), nor from the
    core count (G, a laptop, has more cores than H and I, which have GPUs)."""
    return {
        "G (laptop with the CUDA torch a plain `pip install torch` brings, newest torchrec; not in the lab's list)": _machine(
            HEALTHY_LAPTOP, torch_version="2.13.0+cu126", torch_cuda="12.6", fbgemm_gpu_version="1.8.0",
            fbgemm_gpu_cpu_version=None, torchrec_version="1.9.0", nccl_available=True, nccl_version=TORCH_NCCL,
            cpu_count=16,
        ),
        "H (GPU node with 4 GPUs, old torchrec; not in the lab's list)": _machine(
            GPU_NODE, gpu_count=4, torchrec_version="1.7.0", cpu_count=12,
        ),
        # one GPU is a GPU: a plan that waits for several (gpu_count > 1, >= 4) leaves this one on a CPU torch
        "I (workstation with one GPU and both fbgemm builds; not in the lab's list)": _machine(
            GPU_NODE, gpu_count=1, fbgemm_gpu_cpu_version="1.8.0", cpu_count=8,
        ),
    }


def _backend_for(facts: EnvFacts) -> tuple[str, int]:
    """The group the machine must be able to start afterwards: NCCL on every GPU of a GPU node, else 2 gloo ranks."""
    return ("nccl", facts.gpu_count) if facts.gpu_count > 0 else ("gloo", 2)


def after_install(facts: EnvFacts, installed: Mapping[str, str]) -> EnvFacts:
    """The machine `facts` after ``pip`` leaves exactly the packages `installed` ({distribution: version}) of
    the four (``torch``, ``fbgemm-gpu``, ``fbgemm-gpu-cpu``, ``torchrec``) installed: its hardware (GPUs) stays,
    the imports that would fail fail, and the result is a machine the doctor could see (:func:`impossible`).
    A torch version names its build: ``2.13.0+cpu`` or ``2.13.0+cu126``. `facts` must come from a CUDA torch
    where the machine has GPUs (a CPU torch sees none): true of every machine in this lab."""
    torch_version = installed.get("torch")
    tag = torch_version.partition("+")[2] if torch_version else ""
    if torch_version and tag not in TORCH_BUILDS:  # pip finds no such build: torch is not installed
        torch_version = None
    cuda_build = tag in TORCH_BUILDS and tag != "cpu"
    torch_cuda = f"{tag[2:-1]}.{tag[-1]}" if cuda_build else None
    torch_error = None if torch_version else _missing("torch")
    gpus = facts.gpu_count if cuda_build else 0
    fbgemm_cuda, fbgemm_cpu, torchrec = installed.get("fbgemm-gpu"), installed.get("fbgemm-gpu-cpu"), installed.get("torchrec")
    fbgemm = fbgemm_cuda if (fbgemm_cuda and cuda_build) or not fbgemm_cpu else fbgemm_cpu
    if torch_error:
        fbgemm_error = torch_error  # fbgemm_gpu imports torch first
    elif not fbgemm:
        fbgemm_error = _missing("fbgemm_gpu")
    elif fbgemm_cuda and not cuda_build and not fbgemm_cpu:
        fbgemm_error = LOAD_ERROR
    elif _major_minor(fbgemm) and _torch_for(_major_minor(fbgemm)) != _major_minor(torch_version):
        fbgemm_error = LOAD_ERROR
    else:
        fbgemm_error = None
    if not torchrec:
        torchrec_error = _missing("torchrec")
    elif fbgemm_error:
        torchrec_error = fbgemm_error  # torchrec imports fbgemm_gpu: the same error
    elif _major_minor(torchrec) != _major_minor(fbgemm):
        torchrec_error = "ImportError: torchrec cannot load fbgemm_gpu's operators"
    else:
        torchrec_error = None
    if torchrec_error:
        metrics_error = None  # not probed
    elif not facts.torchmetrics_version:
        metrics_error = _missing("torchmetrics")
    else:
        metrics_error = facts.rec_metrics_error
    nccl = cuda_build and not torch_error
    return _machine(
        facts,
        torch_version=torch_version,
        torch_cuda=torch_cuda if not torch_error else None,
        fbgemm_gpu_version=fbgemm_cuda,
        fbgemm_gpu_cpu_version=fbgemm_cpu,
        torchrec_version=torchrec,
        fbgemm_import_error=fbgemm_error,
        torchrec_import_error=torchrec_error,
        torch_import_error=torch_error,
        cuda_available=gpus > 0 and not torch_error,
        gpu_count=gpus if not torch_error else 0,
        nccl_available=nccl,
        nccl_version=TORCH_NCCL if nccl else None,
        # torchrec's metadata pin (torchmetrics==X): known for the course's torchrec; none read for others
        torchmetrics_wanted=PINNED_TORCHMETRICS if torchrec and _major_minor(torchrec) == _major_minor(PINNED_TORCHREC) else None,
        rec_metrics_error=metrics_error,
    )


@exercise
def check_install_plan(install_plan: Callable[[EnvFacts], Any]) -> None:
    """`install_plan(facts)` says which packages a broken machine should end up with; the check installs them
    in simulation (:func:`after_install`), re-runs the doctor with the group the machine must start (NCCL on a
    GPU node, gloo on a laptop), and wants no error and no warning, on every machine of :func:`broken_machines`
    and of :func:`_fresh_machines` (three the lab does not show), with the course's pinned releases (a whole stack
    one release up or down is in lockstep, so the doctor accepts it, but the labs are not written for it)."""
    from course_lib.checks import one_line

    for label, facts in {**broken_machines(), **_fresh_machines()}.items():
        try:
            plan = checked_call("install_plan", install_plan, facts)
        except CheckFailed:
            raise
        except Exception as error:  # noqa: BLE001  (the learner's code: report it)
            fail(f"install_plan raised {one_line(error)} for machine {label}")
        if not isinstance(plan, Mapping):
            fail(
                f"for machine {label}, install_plan returned a {type(plan).__name__}",
                'return {distribution: version}, e.g. {"torch": "2.13.0+cpu", ...}: the packages the machine ends up with',
            )
        unknown = [name for name in plan if name not in PACKAGES]
        if unknown:
            fail(f"for machine {label}, install_plan names {unknown}", f"the distributions are {list(PACKAGES)}")
        not_text = {name: version for name, version in plan.items() if not isinstance(version, str)}
        if not_text:
            fail(
                f"for machine {label}, install_plan gives versions that are not strings: {not_text}",
                'a version is text, as pip writes it: "1.8.0", not 1.8 (a float would also make 1.10 equal 1.1)',
            )
        torch_version = plan.get("torch")
        if torch_version is not None and "+" not in str(torch_version):
            fail(
                f"for machine {label}, torch {torch_version!r} does not say which build",
                f"write the build: {PINNED_TORCH}+cpu, or {PINNED_TORCH}+cu126 from the PyTorch index for CUDA 12.6 "
                "(plain `pip install torch` on Linux gets a CUDA build)",
            )
        build = str(torch_version).partition("+")[2]
        if torch_version is not None and build not in TORCH_BUILDS:
            fail(
                f"for machine {label}, install_plan installs torch {torch_version}, a build the course does not install: "
                f"the builds are {', '.join('+' + b for b in TORCH_BUILDS)}, and the simulation, like pip, installs no "
                "build it does not know (a tag is not a promise that the build exists)",
                f"write {PINNED_TORCH}+cpu for a machine without a GPU, {PINNED_TORCH}+cu126 for a GPU node (the "
                "PyTorch index for CUDA 12.6, as make lab CUDA=cu126 installs it)",
            )
        if facts.gpu_count == 0 and ("+cu" in str(torch_version) or ("fbgemm-gpu" in plan and "fbgemm-gpu-cpu" not in plan)):
            fail(
                f"for machine {label} (no GPU), install_plan installs a CUDA build: {dict(plan)}",
                "with no GPU its CUDA libraries are a large download that nothing uses (and the CUDA fbgemm-gpu cannot "
                "load on a CPU torch): a laptop's CPU torch needs fbgemm-gpu-cpu, torch +cpu",
            )
        backend, world_size = _backend_for(facts)
        report = doctor(backend=backend, world_size=world_size, facts=after_install(facts, plan))
        problems = [p for p in report.problems if p.code != "python-version"]
        if problems:
            first = problems[0]
            hints = {
                "nccl-without-gpu": "a GPU node needs a CUDA build of torch (and the CUDA fbgemm-gpu) to run NCCL on its GPUs",
                "fbgemm-cpu-on-cuda": "on a GPU node, fbgemm-gpu (the CUDA build) runs the tables on the GPUs; fbgemm-gpu-cpu cannot",
                "fbgemm-cuda-on-cpu": "a laptop's CPU torch needs fbgemm-gpu-cpu: the CUDA fbgemm-gpu cannot load there",
                "fbgemm-both-installed": "keep one fbgemm: the two builds overwrite each other's files",
                "version-lockstep": "torchrec 1.Y, fbgemm 1.Y and torch 2.(Y+5) move together: the course pins 1.8 / 1.8 / 2.13",
                "torchrec-missing": "the machine still needs torchrec (installed with --no-deps)",
                "fbgemm-missing": "torchrec needs one fbgemm build",
                "torch-missing": "keep torch",
            }
            fail(
                f"after installing {dict(plan)} on machine {label}, the doctor still says: {first.summary}",
                hints.get(first.code, first.fix),
            )
        # the doctor checks that the stack moves together, not that it is the course's: a whole stack one release
        # up or down (torchrec 1.7 with torch 2.12) satisfies it, and the labs are written for the pins
        pins = {"torch": PINNED_TORCH, "fbgemm-gpu": PINNED_FBGEMM, "fbgemm-gpu-cpu": PINNED_FBGEMM,
                "torchrec": PINNED_TORCHREC}
        off_pin = {name: version for name, version in plan.items() if _major_minor(version) != _major_minor(pins[name])}
        if off_pin:
            fail(
                f"for machine {label}, install_plan installs {off_pin}: a stack that moves together, so the doctor "
                f"finds nothing, but not the course's (torch {PINNED_TORCH}, fbgemm {PINNED_FBGEMM}, torchrec "
                f"{PINNED_TORCHREC}), which every lab is written for",
                f"install the course's pins on every machine, whatever versions it had: torch {PINNED_TORCH} (+cpu or +cu126), "
                f"fbgemm {PINNED_FBGEMM}, torchrec {PINNED_TORCHREC}",
            )
    passed(f"install_plan repairs the lab's {len(broken_machines())} machines and {len(_fresh_machines())} it has not seen: "
           "the doctor finds nothing after each install")


def _first_group_on_rank(fn: Callable[[], Any], args_by_rank: list[tuple]) -> tuple[Any, list[str], list[list[float]]]:
    """On each rank: fn() with its collectives counted, and what each all_reduce was given (before it ran)."""
    import torch

    from course_lib.checks.lab01 import _call_counting

    given: list[list[float]] = []

    def record(name: str, args: tuple, kwargs: dict) -> None:
        tensor = kwargs.get("tensor", args[0] if args else None)
        if name == "all_reduce" and isinstance(tensor, torch.Tensor):
            given.append([float(v) for v in tensor.detach().flatten().tolist()])

    result, calls = _call_counting(fn, args_by_rank, record)
    return result, calls, given


@exercise
def check_first_group(
    first_group: Callable[[], Any], launch: Callable[..., list[Any]] | None = None, timeout: float = 60.0
) -> None:
    """Run `first_group` on 2 and 3 ranks, check what each rank returned and that the sum travelled by one
    all_reduce (not worked out locally from the world size)."""
    import torch

    from course_lib.checks import launch_quietly, one_line
    from course_lib.launcher.launch import LaunchError

    if launch is None:
        from course_lib import launch
    for world_size in (2, 3):
        try:
            outcomes = launch_quietly(launch, _first_group_on_rank, first_group, [()] * world_size, world_size=world_size, timeout=timeout)
        except LaunchError as error:
            raised = [f for f in error.failures if f.kind == "raised"]
            if raised and all(f.exc_type == "NotImplementedError" and not f.message.strip() for f in raised):
                raise
            text = str(error)
            hint = "run it yourself to read each rank's traceback: launch(first_group, world_size=2)"
            if "never finished" in text or "timed out" in text or "Connection closed" in text:
                hint = "a rank waited in a collective that another rank never called: every rank must call all_reduce"
            first = error.failures[0].headline() if error.failures else one_line(error)
            fail(f"first_group failed on {world_size} ranks: {first}", hint)
        for rank, (got, calls, given) in enumerate(outcomes):
            if not isinstance(got, dict) or not {"rank", "world_size", "rank_sum"} <= set(got):
                fail(f"rank {rank} returned {got!r}", "return a dict with keys 'rank', 'world_size', 'rank_sum'")
            if not isinstance(got["rank"], int) or not isinstance(got["world_size"], int):
                fail(
                    f"rank {rank} returned rank={got['rank']!r}, world_size={got['world_size']!r}",
                    "both must be ints: dist.get_rank() and dist.get_world_size() give them",
                )
            if (got["rank"], got["world_size"]) != (rank, world_size):
                fail(f"rank {rank} of {world_size} reported itself as rank {got['rank']} of {got['world_size']}")
            expected = world_size * (world_size - 1) / 2
            if isinstance(got["rank_sum"], torch.Tensor):
                fail(
                    f"rank {rank} returned rank_sum={got['rank_sum']!r}, a tensor: the exercise asks for the sum, a number",
                    "read the number out of the tensor after the all_reduce: t.item()",
                )
            try:
                value = float(got["rank_sum"])
            except (TypeError, ValueError, RuntimeError):
                fail(f"rank {rank} returned rank_sum={got['rank_sum']!r}", "one number: t.item() after the all_reduce")
            if value != expected:
                if value == rank and "all_reduce" in calls:
                    hint = (
                        "that is this rank's own value: read the tensor you gave all_reduce, after it has finished "
                        "(with async_op=True, call .wait() on the work it returns first)"
                    )
                elif value == rank:
                    hint = "each rank only knows its own rank: combine them across ranks with dist.all_reduce"
                elif value == world_size - 1:
                    hint = "that is the largest rank (ReduceOp.MAX): sum them with ReduceOp.SUM, the default"
                elif value == expected / world_size:
                    hint = "all_reduce sums by default (ReduceOp.SUM); do not divide"
                else:
                    hint = "every rank puts in its own rank and all_reduce sums them"
                fail(f"on {world_size} ranks, rank {rank} got rank_sum={got['rank_sum']}, expected {expected:g}", hint)
            if not calls:
                fail(
                    f"the right sum, but rank {rank} ran no collective: it worked the sum out from the world size",
                    "the exercise is the communication: each rank contributes its rank and dist.all_reduce adds them",
                )
            if calls != ["all_reduce"]:
                fail(
                    f"the right sum, but rank {rank} ran {', '.join(calls)}",
                    "one dist.all_reduce sums a tensor across the group and leaves the sum on every rank",
                )
            if not given or not given[0] or given[0][0] != float(rank):
                fail(
                    f"the right sum, but rank {rank} gave all_reduce {given[0] if given else 'no tensor'}, not its rank "
                    f"{rank}: the sum was worked out another way",
                    "each rank puts its own rank in the tensor, all_reduce adds them, and rank_sum is read from that tensor",
                )
    passed("first_group runs on 2 and 3 ranks and every rank agrees on the sum of ranks, by one all_reduce")
