#!/usr/bin/env bash
# Builds ./.venv with the course's pinned stack, or does nothing when it is already up to date.
#   CUDA=cu126 tools/setup_venv.sh   -> CUDA builds of torch and fbgemm-gpu (GPU nodes)
#   tools/setup_venv.sh              -> CPU builds (laptops, CI)
# The stamp records a hash of every file that decides what gets installed, so a second run installs nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

CUDA=${CUDA:-}
VENV=.venv
variant=${CUDA:-cpu}

# The pinned wheels exist for CPython 3.11 (any patch release, Debian 12's 3.11.2 included), 3.12 and 3.13, on
# Linux x86-64 and aarch64 (tools/wheels.py asks pip's resolver; tests/test_python_versions.py keeps it true).
# PYTHON chooses the interpreter; otherwise the newest of python3.13, python3.12, python3.11 found on PATH.
supported() {  # prints the interpreter's version when it is one the pins support, else fails
  "$1" -c 'import sys; v = sys.version_info; ok = v[:2] in ((3, 11), (3, 12), (3, 13))
print("%d.%d.%d" % v[:3]); sys.exit(0 if ok else 1)' 2>/dev/null
}
if [ -z "${PYTHON:-}" ]; then
  for candidate in python3.13 python3.12 python3.11; do
    if command -v "$candidate" >/dev/null 2>&1 && supported "$candidate" >/dev/null; then PYTHON=$candidate; break; fi
  done
  if [ -z "${PYTHON:-}" ]; then
    echo "setup: no python3.13, python3.12 or python3.11 on PATH. Install one, or point PYTHON at it: make lab PYTHON=/path/to/python3.12" >&2
    exit 1
  fi
fi
if ! command -v "$PYTHON" >/dev/null 2>&1; then
  echo "setup: $PYTHON not found. Install Python 3.11, 3.12 or 3.13, or point PYTHON at one: make lab PYTHON=/path/to/python3.12" >&2
  exit 1
fi
if ! version=$(supported "$PYTHON"); then
  echo "setup: $PYTHON is $("$PYTHON" --version 2>&1); the pinned wheels need CPython 3.11, 3.12 or 3.13 (PYTHON=...)." >&2
  exit 1
fi
if [ -n "${SETUP_CHOOSE_ONLY:-}" ]; then  # tests: say which interpreter would be used, build nothing
  echo "setup: would use $PYTHON (Python $version)"
  exit 0
fi

# The PyTorch wheel index is asked once, for at most 5 s in all (a thread bounds name lookup too, which
# urlopen's timeout does not). Where it cannot be reached (a machine that sees only PyPI or a mirror of it),
# pip would retry it for every package, 5 times each with back-off (155 retries, about 5 minutes here), and
# then quietly take PyPI's torch anyway: setup says so and goes to PyPI alone at once.
# Proxies (https_proxy) are honoured; PIP_CERT, REQUESTS_CA_BUNDLE or SSL_CERT_FILE name a CA bundle.
index_answers() {  # prints why not and fails unless index $1 lists torch (HTTP 200) within 5 s
  "$PYTHON" - "$1" <<'PY'
import os, ssl, sys, threading, urllib.error, urllib.request
url, outcome = sys.argv[1].rstrip("/") + "/torch/", []  # the page pip itself asks for first
def ask():
    try:
        bundle = next((os.environ[k] for k in ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE") if os.environ.get(k)), None)
        context = ssl.create_default_context(cafile=bundle) if bundle and os.path.isfile(bundle) else None
        with urllib.request.urlopen(url, timeout=5, context=context) as answer:
            outcome.append(None if answer.status == 200 else f"HTTP {answer.status} for {url}")
    except urllib.error.HTTPError as error:  # a proxy's 404 or 403: no index there
        outcome.append(f"HTTP {error.code} {error.reason} for {url}")
    except Exception as error:
        outcome.append(str(getattr(error, "reason", None) or error) or type(error).__name__)
asker = threading.Thread(target=ask, daemon=True)
asker.start()
asker.join(5)
why = outcome[0] if outcome else "no answer within 5 s"
if why:
    print(why)
os._exit(1 if why else 0)
PY
}
torch_cpu_index=${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}
torch_index=$torch_cpu_index
if [ -n "$CUDA" ]; then torch_index="https://download.pytorch.org/whl/$CUDA"; fi
say_unreachable() {  # $1: why the probe failed
  local wanted="the CPU build ($(grep '^torch==' requirements/torch-cpu.txt | cut -d= -f3)+cpu, about 1.7 GB in .venv)"
  if [ -n "$CUDA" ]; then wanted="the $CUDA build"; fi
  echo "setup: the PyTorch wheel index $torch_index cannot be reached ($1)." >&2
  echo "setup: installing PyPI's torch instead of $wanted: PyPI's Linux torch is the CUDA 13.0 build," >&2
  echo "setup:   with its NVIDIA libraries about 5.4 GB in .venv and minutes to download; it runs on CPU too." >&2
  if [ -z "$CUDA" ]; then echo "setup:   TORCH_CPU_INDEX=<a mirror of $torch_cpu_index> make setup gets the CPU build (README)." >&2; fi
}
if [ -n "${SETUP_PROBE_ONLY:-}" ]; then  # tests: say where torch would come from, build nothing
  if why=$(index_answers "$torch_index"); then echo "setup: would install torch from $torch_index"
  else say_unreachable "$why"; echo "setup: would install torch from PyPI alone"; fi
  exit 0
fi

hash=$(cat requirements/*.txt pyproject.toml tools/setup_venv.sh | sha256sum | cut -c1-16)
stamp="$hash $variant ${version%.*}"

if [ -x "$VENV/bin/python" ] && [ -f "$VENV/.course-stamp" ] && [ "$(cat "$VENV/.course-stamp")" = "$stamp" ]; then
  echo "setup: .venv is up to date ($variant); nothing to install."
  exit 0
fi

start=$(date +%s)
echo "setup: building .venv ($variant) with $("$PYTHON" --version 2>&1) ..."
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@" 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2); }

# 1. torch and fbgemm first, as a pair of the same build (CPU or CUDA).
if [ -n "$CUDA" ]; then
  if why=$(index_answers "$torch_index"); then
    pip install --index-url "$torch_index" --extra-index-url https://pypi.org/simple -r requirements/torch-cuda.txt
  else
    say_unreachable "$why"
    pip install -r requirements/torch-cuda.txt
  fi
elif "$VENV/bin/python" -m pip install --dry-run -q --no-deps --no-index \
    "$(grep '^torch==' requirements/torch-cpu.txt)+cpu" >/dev/null 2>&1; then
  pip install -r requirements/torch-cpu.txt   # a local wheel folder has the CPU build (CI machines)
elif why=$(index_answers "$torch_index"); then
  # PyPI's Linux torch is the CUDA build (GBs); the CPU build (2.13.0+cpu) lives on the PyTorch CPU index.
  pip install --index-url "$torch_index" --extra-index-url https://pypi.org/simple -r requirements/torch-cpu.txt
else
  say_unreachable "$why"
  pip install -r requirements/torch-cpu.txt
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
