"""Does the course's pinned stack install on another Python or CPU? pip's own resolver answers, downloading nothing.

    .venv/bin/python tools/wheels.py                 # Python 3.11, 3.12, 3.13 on Linux x86-64 and aarch64

For each target it runs ``pip install --dry-run --no-deps --ignore-installed`` over every pin the setup
installs (``requirements/torch-cpu.txt``, ``torchrec.txt`` and the full lock ``constraints.txt``) with
pip's ``--python-version`` / ``--platform`` / ``--abi`` options, so a pin without a wheel (or an sdist) for
that interpreter, or whose ``Requires-Python`` excludes it, is reported by pip itself; a pin on a yanked release
(which pip installs with only a warning) is reported too. Package metadata comes
from the index (PyPI; this machine's pip configuration, such as local wheel folders, is set aside); nothing
is installed. The torch pin is checked against PyPI's ``torch==2.13.0``: the
``+cpu`` build lives on the PyTorch index, which publishes the same versions and Pythons.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from course_lib.env import SUPPORTED_PYTHONS  # noqa: E402  (the one list of supported Pythons)

REQUIREMENTS = ["requirements/constraints.txt", "requirements/torch-cpu.txt", "requirements/torchrec.txt"]
# Each supported Python at the oldest patch release the lock accepts (course_lib.env.SUPPORTED_PYTHONS).
PYTHONS = {f"{major}.{minor}": f"{major}.{minor}.{patch}" for (major, minor), patch in SUPPORTED_PYTHONS.items()}
PLATFORMS = {
    "x86_64": ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "linux_x86_64"],
    "aarch64": ["manylinux_2_28_aarch64", "manylinux_2_17_aarch64", "manylinux2014_aarch64", "linux_aarch64"],
}
_UNREACHABLE = ("Could not fetch URL", "NewConnectionError", "Network is unreachable", "Temporary failure in name resolution")


@dataclass
class Resolution:
    python: str
    machine: str
    ok: bool
    missing: str = ""       # the first pin pip could not satisfy, with pip's reason
    unreachable: bool = False

    def __str__(self) -> str:
        return f"Python {self.python} {self.machine}: " + ("every pin resolves" if self.ok else f"no: {self.missing}")


def _index_only_environment() -> dict[str, str]:
    """This process's environment without pip's configuration: no config file, no PIP_* settings but the
    certificate bundle and timeout, so a machine's local wheel folders or constraints cannot change the answer."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") or k in ("PIP_CERT", "PIP_DEFAULT_TIMEOUT")}
    env["PIP_CONFIG_FILE"] = os.devnull
    return env


def resolve(python: str, machine: str, timeout: float = 600) -> Resolution:
    """Ask pip whether every pin of the course installs on `python` ("3.12") and `machine` ("x86_64")."""
    version = PYTHONS.get(python, python)
    abi = "cp" + "".join(version.split(".")[:2])
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-deps",
               "--disable-pip-version-check", "--python-version", version, "--implementation", "cp",
               "--abi", abi, "--abi", "abi3", "--abi", "none"]
    for platform in PLATFORMS[machine]:
        command += ["--platform", platform]
    for requirement in REQUIREMENTS:
        command += ["-r", str(REPO / requirement)]
    with tempfile.TemporaryDirectory() as target:
        done = subprocess.run(command + ["--target", target], capture_output=True, text=True, timeout=timeout,
                              env=_index_only_environment())
    output = done.stdout + done.stderr
    yanked = re.search(r"a yanked version: '([^']+)' candidate \(version (\S+).*?\nReason for being yanked: (.*)", output)
    if done.returncode == 0 and yanked:  # pip installs a pinned yanked release with only a warning
        name, version, reason = yanked.groups()
        return Resolution(python, machine, False, f"{name}=={version} is yanked: {reason.strip()}")
    if done.returncode == 0:
        return Resolution(python, machine, True)
    if any(sign in output for sign in _UNREACHABLE):
        return Resolution(python, machine, False, "the package index could not be reached", unreachable=True)
    conflict = re.search(r"The conflict is caused by:\n((?:\s+.*\n)+)", output)
    match = re.search(r"No matching distribution found for (\S+)", output)
    if conflict and not match:
        return Resolution(python, machine, False, "; ".join(line.strip() for line in conflict.group(1).splitlines()))
    reason = re.search(r"Could not find a version that satisfies the requirement \S+ \(from versions: ([^)]*)\)", output)
    missing = match.group(1) if match else output.strip().splitlines()[-1]
    if reason and not reason.group(1).strip():
        missing += " (no file for this Python and platform at all)"
    elif reason:
        missing += f" (the index has: ...{reason.group(1)[-60:]})"
    return Resolution(python, machine, False, missing)


def main() -> int:
    results = [resolve(python, machine) for machine in PLATFORMS for python in PYTHONS]
    for result in results:
        print(result)
    return 0 if all(r.ok for r in results if r.machine == "x86_64") else 1


if __name__ == "__main__":
    sys.exit(main())
