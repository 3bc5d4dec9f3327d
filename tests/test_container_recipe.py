"""The container recipe (Containerfile, .dockerignore, .devcontainer) agrees with itself and with the Makefile.

These read files only; building and running the image is `make test-container` (tools/test_container.sh).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONTAINERFILE = (REPO / "Containerfile").read_text()


def instructions(name: str) -> list[str]:
    """The arguments of every `name` instruction in the Containerfile (continuation lines joined)."""
    joined = re.sub(r"\\\n", " ", CONTAINERFILE)
    return [line.split(None, 1)[1] for line in joined.splitlines() if line.startswith(name + " ")]


def devcontainer() -> dict:
    text = (REPO / ".devcontainer" / "devcontainer.json").read_text()
    return json.loads(re.sub(r"^\s*//.*$", "", text, flags=re.M))  # JSON with comments, as VS Code reads it


def test_the_base_image_is_a_public_default_that_a_build_arg_replaces():
    assert "BASE_IMAGE=docker.io/library/debian:bookworm-slim" in instructions("ARG")
    assert instructions("FROM")[0].startswith("${BASE_IMAGE} ")


def test_the_image_runs_as_a_learner_not_root():
    users = instructions("USER")
    assert users and users[-1] not in ("root", "0"), users


def test_no_machine_paths_are_baked_in():
    """This machine's pip configuration (wheel folder, CA bundle, constraints) comes in as build args only."""
    for path in ("/opt/", "/etc/xdg", "/etc/ssl", "/root", "/work/", "/tmp/"):
        assert path not in CONTAINERFILE, path
    build_args = [arg.split("=")[0] for arg in instructions("ARG")]
    assert {"PIP_FIND_LINKS", "PIP_CERT"} <= set(build_args)
    pip_settings = [arg for arg in instructions("ARG") if arg.startswith(("PIP_", "TORCH_"))]
    assert all(arg.endswith("=") for arg in pip_settings), f"pip settings must default to empty: {pip_settings}"


def test_jupyterlab_listens_where_a_published_port_reaches_it():
    makefile = (REPO / "Makefile").read_text()
    lab_port = re.search(r"^LAB_PORT \?= (\d+)$", makefile, re.M).group(1)
    assert instructions("EXPOSE") == [lab_port]
    cmd = json.loads(instructions("CMD")[-1])
    lab = re.search(r"^lab: setup\n\t(.*)$", makefile, re.M).group(1)  # the same server as `make lab` ...
    assert cmd[:2] == [".venv/bin/jupyter", "lab"] and "--notebook-dir=labs" in lab.split() and "--notebook-dir=labs" in cmd
    assert "--ServerApp.ip=0.0.0.0" in cmd and f"--ServerApp.port={lab_port}" in cmd  # ... reachable from outside


def test_the_build_context_leaves_out_machine_local_files():
    ignored = (REPO / ".dockerignore").read_text().splitlines()
    assert {".venv", ".git"} <= set(ignored)

    def entries(text: str) -> set[str]:  # "/.whl/", "**/__pycache__" and "__pycache__/" name the same thing
        lines = (line.strip() for line in text.splitlines())
        return {line.removeprefix("**/").strip("/") for line in lines if line and not line.startswith(("#", "!"))}

    # whatever git leaves out as machine-local (wheel caches, Slurm logs, reports) stays out of the image too
    missing = entries((REPO / ".gitignore").read_text()) - entries("\n".join(ignored))
    assert not missing, f".gitignore leaves out {sorted(missing)}, .dockerignore sends them into the image"


def test_make_lab_answers_on_loopback_unless_told():
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^LAB_IP \?= 127\.0\.0\.1$", makefile, re.M)  # a laptop's server is not on the network
    lab = re.search(r"^lab: setup\n\t(.*)$", makefile, re.M).group(1)
    assert "--ServerApp.ip=$(LAB_IP)" in lab.split()


def test_the_devcontainer_builds_a_stage_of_the_same_recipe_and_forwards_the_lab_port():
    config = devcontainer()
    stages = [line.split()[-1] for line in instructions("FROM")]
    assert config["build"]["dockerfile"] == "../Containerfile" and config["build"]["target"] in stages
    assert config["remoteUser"] in CONTAINERFILE.split("useradd", 1)[1].splitlines()[0]
    assert config["postCreateCommand"] == "make setup"
    assert "make lab" in config["postStartCommand"] and 8888 in config["forwardPorts"]
