#!/usr/bin/env bash
# Builds ./.venv with the course's pinned stack, or does nothing when it is already up to date.
#   CUDA=cu126 tools/setup_venv.sh   -> CUDA builds of torch and fbgemm-gpu (GPU nodes)
#   tools/setup_venv.sh              -> CPU builds (laptops, CI)
# The stamp records a hash of every file that decides what gets installed, so a second run installs nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
CUDA=${CUDA:-}
VENV=.venv
variant=${CUDA:-cpu}
hash=$(cat requirements/*.txt pyproject.toml tools/setup_venv.sh | sha256sum | cut -c1-16)
stamp="$hash $variant"

if [ -x "$VENV/bin/python" ] && [ -f "$VENV/.course-stamp" ] && [ "$(cat "$VENV/.course-stamp")" = "$stamp" ]; then
  echo "setup: .venv is up to date ($variant); nothing to install."
  exit 0
fi

if ! command -v "$PYTHON" >/dev/null 2>&1; then
  echo "setup: $PYTHON not found. Install Python 3.11, or point PYTHON at one: make lab PYTHON=/path/to/python3.11" >&2
  exit 1
fi
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
  echo "setup: $PYTHON is $("$PYTHON" --version 2>&1); the pinned wheels need Python 3.11 (PYTHON=...)." >&2
  exit 1
fi

start=$(date +%s)
echo "setup: building .venv ($variant) with $("$PYTHON" --version 2>&1) ..."
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@" 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2); }

# 1. torch and fbgemm first, as a pair of the same build (CPU or CUDA).
if [ -n "$CUDA" ]; then
  pip install --index-url "https://download.pytorch.org/whl/$CUDA" --extra-index-url https://pypi.org/simple \
    -r requirements/torch-cuda.txt
elif "$VENV/bin/python" -m pip install --dry-run -q --no-deps --no-index \
    "$(grep '^torch==' requirements/torch-cpu.txt)+cpu" >/dev/null 2>&1; then
  pip install -r requirements/torch-cpu.txt   # a local wheel folder has the CPU build (CI machines)
else
  # PyPI's Linux torch is the CUDA build (GBs); the CPU build (2.13.0+cpu) lives on the PyTorch CPU index.
  pip install --index-url "${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}" \
    --extra-index-url https://pypi.org/simple -r requirements/torch-cpu.txt
fi
# 2. everything else, pinned, plus the course library itself (editable).
pip install -r requirements/course.txt -c requirements/constraints.txt -e .
# 3. torchrec without its dependencies: its `fbgemm-gpu` requirement would replace the CPU build.
pip install --no-deps -r requirements/torchrec.txt
# 4. JupyterLab as a learner should get it: nbgrader's authoring panels are for instructors only.
"$VENV/bin/jupyter" labextension disable --level=sys_prefix @jupyter/nbgrader >/dev/null 2>&1 || true
for ext in assignment_list course_list formgrader validate_assignment; do
  "$VENV/bin/jupyter" server extension disable --sys-prefix "nbgrader.server_extensions.$ext" >/dev/null 2>&1 || true
done

# No news or update pop-ups in a learner's JupyterLab (and no calls out to fetch them).
mkdir -p "$VENV/share/jupyter/lab/settings"
cat > "$VENV/share/jupyter/lab/settings/overrides.json" <<'JSON'
{
  "@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": false}
}
JSON

"$VENV/bin/python" -c 'import torch, fbgemm_gpu, torchrec' || {
  echo "setup: the stack installed but does not import; run .venv/bin/python -m course_lib.env for a diagnosis." >&2
  exit 1
}
echo "$stamp" > "$VENV/.course-stamp"
echo "setup: done in $(( $(date +%s) - start )) s."
