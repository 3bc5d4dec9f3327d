"""tests/nbval_sanitize.cfg masks what varies between runs, and nothing a learner's result depends on."""
from __future__ import annotations

import configparser
import re
from pathlib import Path

import pytest
from nbval.plugin import get_sanitize_patterns

CFG = Path(__file__).resolve().parent / "nbval_sanitize.cfg"

# section -> (text with something that varies, what it becomes)
SAMPLES = {
    "site-packages": (
        "cannot import name 'x' (/work/main/.venv/lib/python3.11/site-packages/torch/distributed/fsdp/wrap.py)",
        "cannot import name 'x' (SITE-PACKAGES/torch/distributed/fsdp/wrap.py)",
    ),
    "course-lib-paths": (
        "cannot import name 'x' (/work/main/course_lib/optimizers.py)",
        "cannot import name 'x' (COURSE_LIB/optimizers.py)",
    ),
    "course-lib-lines": (  # an edit above a function must not change a stored traceback
        'File "/work/main/course_lib/optimizers.py", line 190, in row_wise_ebc; /repo/course_lib/training.py:301',
        'File "COURSE_LIB/optimizers.py", line N, in row_wise_ebc; COURSE_LIB/training.py:N',
    ),
    "temp-paths": ("FileStore('/tmp/course-launch-k3j2/store') ready", "FileStore('/tmp/TMPPATH') ready"),
    "memory-addresses": ("<function f at 0x7f3a2c1b9e40>", "<function f at 0xADDRESS>"),
    "pids": ("rank 1 (pid 48213) exited; pid=48214", "rank 1 (pid PID) exited; pid=PID"),
    "loopback-ports": (
        "listening on 127.0.0.1:29517 and localhost:8888; gloo Read error [127.0.0.1]:11454",
        "listening on 127.0.0.1:PORT and localhost:PORT; gloo Read error [127.0.0.1]:PORT",
    ),
    "timestamps": ("[2026-12-03T06:29:11.867673Z] started", "[TIMESTAMP] started"),
    "durations": ("elapsed 01:02:03", "elapsed HH:MM:SS"),
    "progress-elapsed": ("10/10 [00:01<00:00, 9.54it/s]", "10/10 [ELAPSED<LEFT, RATE]"),
    "progress-rates": ("train: 2.5s/it, 12.0 MB/s", "train: RATE, RATE"),
    "timings": ("12.3 s, 45 ms, 1.2e-3 s, done in 0.52s", "TIME, TIME, TIME, done in TIME"),
    "ipython-cell-numbers": ("Cell In[17], line 3", "Cell In[N], line 3"),
    # course_lib.doctor()'s report of the learner's own machine (lab 00): which supported Python, the core count,
    # and which build of torch without a GPU (the CPU build, or PyPI's CUDA build: a plain `pip install torch`)
    "doctor-python-version": ("Python        3.13.0\nCUDA", "Python        3.11-3.13\nCUDA"),
    "doctor-cpu-cores": ("NCCL          not available\nCPU cores     8\nAll good", "NCCL          not available\nCPU cores     N\nAll good"),
    "torch-build-without-gpu": (
        "torch         2.13.0 (CUDA 13.0 build)\ntorch           2.13.0+cpu\ntorch         2.13.0+cpu (CPU build)",
        "torch         2.13.0 (CPU build or PyPI's CUDA build)\ntorch           2.13.0 (CPU build or PyPI's CUDA build)\n"
        "torch         2.13.0 (CPU build or PyPI's CUDA build)",
    ),
    "nccl-without-gpu": ("CUDA          not available (0 GPUs)\nNCCL          available (2.29.7)",
                         "CUDA          not available (0 GPUs)\nNCCL          not usable (no GPU)"),
    "nccl-without-gpu-problem": (
        "✗ backend='nccl' needs CUDA GPUs, but torch (CUDA 13.0 build) sees none\n"
        '  fix: use backend="gloo" (or "auto", which picks gloo without enough GPUs); or run on a GPU node (check '
        "`nvidia-smi` and CUDA_VISIBLE_DEVICES)",
        "✗ backend='nccl' needs CUDA GPUs, and this machine has none\n"
        '  fix: use backend="gloo" (or "auto", which picks gloo without enough GPUs); or run on a GPU node',
    ),
    "no-cuda-device": (
        "shard_quant_model: AssertionError: Torch not compiled with CUDA enabled\n"
        "CPUOffloadPolicy(pin_memory=True): RuntimeError: Found no NVIDIA driver on your system. Please check that you "
        "have an NVIDIA GPU and installed a driver from http://www.nvidia.com/Download/index.aspx",
        "shard_quant_model: NO-CUDA-DEVICE\nCPUOffloadPolicy(pin_memory=True): NO-CUDA-DEVICE",
    ),
    # the same remote traceback as Python 3.13 prints it (what 3.11 prints is in test_tracebacks_of_3_11_and_3_13_agree)
    "traceback-statements": (
        '  File "COURSE_LIB/optimizers.py", line N, in row_wise_ebc\n    return DistributedModelParallel(\n'
        "        planning.meta_ebc(tables), plan=plan, sharders=[sharder]\n    )\n"
        '  File "SITE-PACKAGES/torchrec/distributed/model_parallel.py", line 541, in _shard_modules_impl\n'
        "    sharded_module = self._sharder_map[sharder_key].shard(\n        module,\n    ...<3 lines>...\n"
        "        path,\n    )\n"
        '  File "SITE-PACKAGES/torchrec/distributed/logging_handlers.py", line 117, in wrapper',
        '  File "COURSE_LIB/optimizers.py", line N, in row_wise_ebc\n    return DistributedModelParallel(\n'
        '  File "SITE-PACKAGES/torchrec/distributed/model_parallel.py", line 541, in _shard_modules_impl\n'
        "    sharded_module = self._sharder_map[sharder_key].shard(\n"
        '  File "SITE-PACKAGES/torchrec/distributed/logging_handlers.py", line 117, in wrapper',
    ),
    "traceback-carets": (
        "    self._optimizer: optim.Optimizer = optim_factory(pass_params)\n                                       ~~~~~~~^^^\n"
        "    return DistributedModelParallel(\n           ^^^^^^^^^^^^^^^^^^^^^^^^^\n  File",
        "    self._optimizer: optim.Optimizer = optim_factory(pass_params)\n    return DistributedModelParallel(\n  File",
    ),
    "pydoc-signature": (
        "Help on function parallelize in module course_lib.fsdp:\n\nparallelize(\n    model: 'nn.Module',\n    *,\n"
        "    mesh: 'DeviceMesh | None' = None\n) -> 'nn.Module'\n    Shard `model`.",
        "Help on function parallelize in module course_lib.fsdp:\n\nparallelize(SIGNATURE) -> 'nn.Module'\n    Shard `model`.",
    ),
    "blank-line-spaces": ("    Shard `model`.\n    \n    Args:", "    Shard `model`.\n\n    Args:"),
    "dcp-metadata-size": ("{'.metadata': '15,953 B', '__0_0.distcp': '83,121 B'}", "{'.metadata': 'N B', '__0_0.distcp': '83,121 B'}"),
    "nccl-compiled-in": ("gloo available: True, NCCL available: True", "gloo available: True, NCCL available: COMPILED-IN-OR-NOT"),
}

UNCHANGED = [
    "rank 0 got tensor([3., 3.])",
    "AUC 0.7312",
    "loss 0.6931 after 30 steps on 2 ranks",
    "world_size=2, 26 tables, 128 dims, 1000 rows",
    "KeyedJaggedTensor(keys=['user', 'item'], lengths=tensor([1, 2, 0, 1]))",
    "expected 2 shards of 500 rows for table 'user', got 1 of 1000",
    "torch 2.13.0+cpu, torchrec 1.8.0, python 3.11.7",
    "ShardingType.ROW_WISE: 4 shards, 0x0 bytes moved",
    # a GPU node's report keeps its build, its GPUs and its NCCL; an unsupported Python stays visible
    "Python        3.10.12\ntorch         2.13.0+cu126 (CUDA 12.6 build)\nCUDA          available, 8 GPUs\n"
    "NCCL          available (2.27.5)",
    "torch         2.12.0+cpu (CPU build), import fails",
    # a module's repr spans lines and closes its brackets the way a statement in a traceback does
    "EmbeddingBagCollection(\n  (embedding_bags): ModuleDict(\n    (t1): EmbeddingBag(1000, 16, mode='sum')\n  )\n)",
    "Sequential(\n    (0): Linear(in_features=8, out_features=4, bias=True)\n        (1): ReLU()\n    )",
    "parallelize(model, blocks=None) -> nn.Module",  # a signature outside help()
    "x ^ y = 3\n    ^^ 2",
]


def patterns_from_configparser() -> dict[str, tuple[str, str]]:
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(CFG, encoding="utf-8")
    return {name: (parser[name]["regex"], parser[name]["replace"]) for name in parser.sections()}


def sanitize(text: str) -> str:
    """What nbval does to an output string."""
    for regex, replace in patterns_from_configparser().values():
        text = re.sub(regex, replace, text)
    return text


def test_nbval_reads_the_same_patterns_as_configparser():
    assert get_sanitize_patterns(CFG.read_text(encoding="utf-8")) == list(patterns_from_configparser().values())


def test_every_pattern_has_a_sample():
    assert sorted(patterns_from_configparser()) == sorted(SAMPLES)


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_pattern_masks_its_sample(name):
    regex, replace = patterns_from_configparser()[name]
    text, expected = SAMPLES[name]
    assert re.search(regex, text), f"[{name}] does not match {text!r}"
    assert sanitize(text) == expected


@pytest.mark.parametrize("text", UNCHANGED)
def test_ordinary_output_is_left_alone(text):
    assert sanitize(text) == text


@pytest.mark.parametrize("backend", [None, "nccl"])
def test_both_builds_of_torch_without_a_gpu_give_the_same_doctor_report(backend):
    """Lab 00's doctor cells, stored with the CPU build, pass with PyPI's CUDA build (and any supported Python):
    the two reports differ only where the sanitizer masks them, and a GPU node's report stays different."""
    import dataclasses

    from course_lib.checks.lab00 import HEALTHY_LAPTOP
    from course_lib.env import doctor

    world_size = 2 if backend else None
    cpu = HEALTHY_LAPTOP  # setup's CPU build on Python 3.11
    pypi = dataclasses.replace(cpu, python_version="3.13.0", torch_version="2.13.0", torch_cuda="13.0",
                               nccl_available=True, nccl_version="2.29.7")
    gpu = dataclasses.replace(pypi, torch_version="2.13.0+cu126", torch_cuda="12.6", cuda_available=True, gpu_count=2)
    cpu_text, pypi_text = str(doctor(backend, world_size, facts=cpu)), str(doctor(backend, world_size, facts=pypi))
    assert cpu_text != pypi_text
    assert sanitize(cpu_text) == sanitize(pypi_text), (cpu_text, pypi_text)
    assert sanitize(str(doctor(backend, world_size, facts=gpu))) != sanitize(cpu_text)


# One traceback as Python 3.11 (and 3.12) and 3.13 print it (traceback.format_exception, the module below).
TRACEBACK_3_11 = """Traceback (most recent call last):
  File "/tmp/tb/tbmod.py", line 6, in build
    return Wrapper(
           ^^^^^^^^
  File "/tmp/tb/tbmod.py", line 3, in __init__
    self._optimizer: object = factory(a)
                              ^^^^^^^^^^
  File "/tmp/tb/tbmod.py", line 7, in <lambda>
    len(tables), device or "cpu", lambda params: make(params, lr=0.01)
                                                 ^^^^^^^^^^^^^^^^^^^^^
  File "/tmp/tb/tbmod.py", line 11, in make
    raise ValueError("optimizer got an empty parameter list")
ValueError: optimizer got an empty parameter list"""
TRACEBACK_3_13 = """Traceback (most recent call last):
  File "/tmp/tb/tbmod.py", line 6, in build
    return Wrapper(
        len(tables), device or "cpu", lambda params: make(params, lr=0.01)
    )
  File "/tmp/tb/tbmod.py", line 3, in __init__
    self._optimizer: object = factory(a)
                              ~~~~~~~^^^
  File "/tmp/tb/tbmod.py", line 7, in <lambda>
    len(tables), device or "cpu", lambda params: make(params, lr=0.01)
                                                 ~~~~^^^^^^^^^^^^^^^^^
  File "/tmp/tb/tbmod.py", line 11, in make
    raise ValueError("optimizer got an empty parameter list")
ValueError: optimizer got an empty parameter list"""
TRACEBACK_MODULE = """class Wrapper:
    def __init__(self, a, b, factory):
        self._optimizer: object = factory(a)

def build(tables, device=None, plan=None):
    return Wrapper(
        len(tables), device or "cpu", lambda params: make(params, lr=0.01)
    )

def make(params, lr):
    raise ValueError("optimizer got an empty parameter list")
"""


def test_tracebacks_of_3_11_and_3_13_agree():
    assert sanitize(TRACEBACK_3_11) == sanitize(TRACEBACK_3_13)
    assert "ValueError: optimizer got an empty parameter list" in sanitize(TRACEBACK_3_13)
    assert sanitize(TRACEBACK_3_13).count("  File ") == 4


def test_this_pythons_traceback_is_one_of_them(tmp_path, monkeypatch):
    """The samples above are what this Python prints (3.11, 3.12 or 3.13)."""
    import sys
    import traceback

    (tmp_path / "tbmod.py").write_text(TRACEBACK_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    import tbmod

    try:
        tbmod.build([1, 2])
    except ValueError as error:
        text = "".join(traceback.format_exception(type(error), error, error.__traceback__.tb_next)).rstrip()
    text = text.replace(str(tmp_path), "/tmp/tb")  # without this test's own frame
    sys.modules.pop("tbmod", None)
    assert text == (TRACEBACK_3_13 if sys.version_info >= (3, 13) else TRACEBACK_3_11)
