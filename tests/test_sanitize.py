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
    # course_lib.doctor()'s report of the learner's own machine (lab 00): the patch release and the core count
    "doctor-python-patch": ("Python        3.11.9\ntorch         2.13.0+cpu",
                            "Python        3.11.N\ntorch         2.13.0+cpu"),
    "doctor-cpu-cores": ("NCCL          not available\nCPU cores     8\nAll good", "NCCL          not available\nCPU cores     N\nAll good"),
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
