# TorchRec & FSDP in Practice. Two commands matter:
#   make lab    set up .venv (first time only) and open JupyterLab on labs/
#   make test   set up .venv (first time only) and run every test and notebook
#   make test-gpu  (GPU nodes) the same notebooks on NCCL, one table of results
# GPU nodes: add CUDA=cu126 (or another CUDA tag of the PyTorch wheel index) to either.
SHELL := /bin/bash
PY := .venv/bin/python
CUDA ?=
# Empty: tools/setup_venv.sh takes the newest of python3.13, python3.12, python3.11 on PATH.
PYTHON ?=
LAB_PORT ?= 8888
LAB_IP ?= 127.0.0.1
LAB_ARGS ?=
# JupyterLab refuses to run as root unless told (containers, CI machines).
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)

.PHONY: setup lab progress test test-unit test-notebooks test-other-cpu test-browser test-cluster test-container test-gpu labs solutions doctor clean

setup:
	@CUDA="$(CUDA)" PYTHON="$(PYTHON)" tools/setup_venv.sh

lab: setup
	$(PY) -m jupyter lab --notebook-dir=labs --ServerApp.ip=$(LAB_IP) --ServerApp.port=$(LAB_PORT) $(ROOT_FLAG) $(LAB_ARGS)

# Which exercises pass, which were tried, which are untouched (from labs/.progress.json, which the checks write).
progress: setup
	@$(PY) -m course_lib.progress --labs labs

test: setup
	$(PY) -m pytest -rs

test-unit: setup
	$(PY) -m pytest tests

test-notebooks: setup
	$(PY) -m pytest solutions

# The notebooks again as another CPU would compute them: ATen's scalar kernels instead of its AVX2/AVX-512
# ones, MKL's conditional-numerical-reproducibility path instead of the one it picks for this CPU, and one
# thread per process (sums split differently). Each of these moves the last digits of losses and AUCs here;
# the cells that print such figures must hold within the tolerance they declare (course_lib/tolerance.py).
OTHER_CPU := ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE OMP_NUM_THREADS=1
test-other-cpu: setup
	$(OTHER_CPU) $(PY) -m pytest solutions

# The labs in a real JupyterLab driven by headless Chromium (skips, saying why, when Chromium is missing).
test-browser: setup
	$(PY) -m pytest tests/browser -rs

# A real two-node Slurm cluster on this machine (root on Debian; installs slurm-wlm and munge with apt when
# missing) runs cluster/capstone.sbatch: a job, a failing job, scancel, a killed node and the resumed job.
# Elsewhere it skips, saying why.
test-cluster: setup
	$(PY) -m pytest tests/cluster -rs

# The course's container end to end with podman, on Debian as root (CI): a debootstrap base (made once), the
# image from Containerfile, JupyterLab answering on the published port, lab 00 with nbval inside it; each
# phase timed, logs in build/container/. Skips, saying why, where podman cannot be installed.
test-container:
	tools/test_container.sh

# Instructors and GPU CI: stop at once without 2 NVIDIA GPUs; else build the CUDA .venv (CUDA=cu126 unless
# given), run the GPU tests and every solution notebook with COURSE_BACKEND=nccl, and print one table.
test-gpu:
	@$(or $(PYTHON),python3) tools/test_gpu.py preflight
	@CUDA="$(or $(CUDA),cu126)" PYTHON="$(PYTHON)" tools/setup_venv.sh
	$(PY) tools/test_gpu.py run

# Regenerate the student notebooks from the solutions (commit the result).
labs: setup
	$(PY) -m course_lib.authoring build

# Re-execute the solutions in place so their stored outputs are current (authors only).
solutions: setup
	COURSE_PROGRESS=text $(PY) -m jupyter nbconvert --to notebook --execute --inplace --ExecutePreprocessor.timeout=600 solutions/*.ipynb
	$(MAKE) labs

doctor: setup
	$(PY) -m course_lib.env

clean:
	rm -rf .venv .pytest_cache
