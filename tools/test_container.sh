#!/usr/bin/env bash
# make test-container: the course's container end to end, on a Debian machine without an image registry.
#   1. installs podman, buildah, runc and debootstrap with apt when they are missing (skips, saying why, where it
#      cannot: not root, no apt-get, or apt-get fails);
#   2. makes the base image with debootstrap from the Debian mirror apt uses here and imports it (once: an
#      existing localhost/course-base:bookworm is reused);
#   3. builds the Containerfile on that base, giving it this machine's pip wheel folder and CA bundle (read from
#      this machine's pip configuration, or CONTAINER_WHEELS / CONTAINER_CA) as build-time mounts;
#   4. starts the image as a learner would (its own CMD: JupyterLab on labs/) with the port published, checks
#      JupyterLab answers HTTP there (token required), then runs lab 00's solution inside it with nbval;
#   5. stops and removes the container (the images stay, so the next run rebuilds only what changed).
# Prints each phase's time. On failure it prints the end of the failing phase's log and the container's log.
#   CONTAINER_KEEP=1      leave the container running after the test (for a look inside)
#   CONTAINER_LOGS=DIR    where the phase logs go (default build/container)
set -euo pipefail
cd "$(dirname "$0")/.."

BASE=${CONTAINER_BASE:-localhost/course-base:bookworm}
IMAGE=${CONTAINER_IMAGE:-localhost/torchrec-course:test}
NAME=course-test-$$
LOGS=${CONTAINER_LOGS:-build/container}
TOKEN=test-container-$RANDOM$RANDOM

# Settings this kind of machine needs (root, no systemd, hybrid cgroups; see DESIGN.md): runc (crun refuses the
# cgroup layout), cgroupfs, a file events log, and ulimits root may set here.
PODMAN=(podman --runtime runc --cgroup-manager cgroupfs --events-backend file)
ULIMITS=(--ulimit nofile=16384:16384 --ulimit nproc=16384:16384)

declare -a TIMES=()
since() {  # seconds since a `date +%s%N` reading, to a tenth
  local tenths=$(( ($(date +%s%N) - $1) / 100000000 ))
  echo "$((tenths / 10)).$((tenths % 10))"
}
report_times() {
  [ ${#TIMES[@]} -gt 0 ] || return 0
  echo "test-container: phase times (s)"
  printf '  %-22s %8s\n' "${TIMES[@]}"
}
fail() {  # message, [log file to show]
  echo "test-container: FAILED: $1" >&2
  if [ -n "${2:-}" ] && [ -s "$2" ]; then
    echo "---- last 60 lines of $2 ----" >&2
    tail -n 60 "$2" >&2
    echo "---- end of $2 ----" >&2
  fi
  exit 1
}
skip() {
  echo "test-container: SKIPPED: $1"
  exit 0
}
phase() {  # name, log file, command...: runs the command with its output in the log, records its time
  local name=$1 log=$2 start status=0
  shift 2
  echo "test-container: $name ..."
  start=$(date +%s%N)
  "$@" >"$log" 2>&1 || status=$?
  TIMES+=("$name" "$(since "$start")")
  [ "$status" = 0 ] || fail "$name (exit $status)" "$log"
}
cleanup() {
  local status=$?
  if "${PODMAN[@]}" container exists "$NAME" 2>/dev/null; then
    if [ "$status" != 0 ]; then
      echo "---- last 60 lines of the container's log ($NAME) ----" >&2
      "${PODMAN[@]}" logs "$NAME" 2>&1 | tail -n 60 >&2 || true
    fi
    if [ -n "${CONTAINER_KEEP:-}" ]; then
      echo "test-container: container $NAME left running (CONTAINER_KEEP): podman rm -f $NAME"
    else
      local start
      start=$(date +%s%N)
      "${PODMAN[@]}" rm -f -t 10 "$NAME" >/dev/null 2>&1 || echo "test-container: could not remove $NAME" >&2
      TIMES+=("stop and remove" "$(since "$start")")
    fi
  fi
  report_times
  exit "$status"
}
trap cleanup EXIT

# ---------------------------------------------------------------- 1. tools
missing=()
for tool in podman runc debootstrap curl; do command -v "$tool" >/dev/null 2>&1 || missing+=("$tool"); done
if [ ${#missing[@]} -gt 0 ]; then
  [ "$(id -u)" = 0 ] || skip "${missing[*]} missing and not root, so they cannot be installed (apt-get install podman buildah runc debootstrap curl)"
  command -v apt-get >/dev/null 2>&1 || skip "${missing[*]} missing and no apt-get to install them (this test builds a Debian base with debootstrap)"
  echo "test-container: installing podman, buildah, runc, debootstrap ..."
  mkdir -p "$LOGS"
  start=$(date +%s%N)
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman buildah runc debootstrap curl; } \
      >"$LOGS/install.log" 2>&1; then
    tail -n 20 "$LOGS/install.log"
    skip "podman could not be installed with apt-get (log above, all of it in $LOGS/install.log)"
  fi
  TIMES+=("install podman" "$(since "$start")")
fi
# Where podman is installed, it must work: from here on every problem is a failure.
mkdir -p "$LOGS"
"${PODMAN[@]}" info >"$LOGS/podman-info.log" 2>&1 || fail "podman is installed but 'podman info' fails" "$LOGS/podman-info.log"

# ---------------------------------------------------------------- 2. base image (cached)
debian_mirror() {  # the Debian archive apt uses here: a deb822 URIs line or a one-line deb entry naming bookworm
  local files=(/etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list /etc/apt/sources.list)
  awk '
    FNR == 1 { uris = "" }
    /^URIs:/ { uris = $2 }
    /^Suites:/ && uris != "" && / bookworm( |$)/ && uris !~ /security/ { print uris; exit }
    /^deb / && $3 == "bookworm" { print $2; exit }
  ' "${files[@]}" 2>/dev/null | head -n 1
}
if "${PODMAN[@]}" image exists "$BASE"; then
  echo "test-container: base image $BASE exists, reused"
  TIMES+=("debootstrap" "cached" "import base" "cached")
else
  mirror=$(debian_mirror)
  mirror=${mirror:-http://deb.debian.org/debian}
  rootfs=$(mktemp -d /var/tmp/course-base.XXXXXX)
  trap 'rm -rf "$rootfs"; cleanup' EXIT
  phase "debootstrap" "$LOGS/debootstrap.log" debootstrap --variant=minbase bookworm "$rootfs" "$mirror"
  phase "import base" "$LOGS/import.log" bash -c "set -o pipefail; tar -C '$rootfs' -c . | ${PODMAN[*]} import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' --change 'CMD [\"/bin/bash\"]' - '$BASE'"
  rm -rf "$rootfs"
  trap cleanup EXIT
fi

# ---------------------------------------------------------------- 3. the course image
pip_setting() {  # this machine's pip setting `key` (find-links, cert): its PIP_ variable, else pip's config files
  local variable="PIP_$(echo "$1" | tr 'a-z-' 'A-Z_')"
  if [ -n "${!variable:-}" ]; then echo "${!variable}"; return; fi
  python3 -m pip config list 2>/dev/null | sed -n "s/^[^.]*\.$1='\(.*\)'\$/\1/p" | head -n 1 || true
}
# Empty CONTAINER_WHEELS / CONTAINER_CA: build from the indexes alone, with the image's own CA certificates.
if [ -n "${CONTAINER_WHEELS+set}" ]; then WHEELS=$CONTAINER_WHEELS; else WHEELS=$(pip_setting find-links); fi
if [ -n "${CONTAINER_CA+set}" ]; then CA=$CONTAINER_CA; else CA=$(pip_setting cert); fi
build=("${PODMAN[@]}" build "${ULIMITS[@]}" --network host --build-arg "BASE_IMAGE=$BASE" -t "$IMAGE" -f Containerfile)
if [ -n "$WHEELS" ]; then
  [ -d "$WHEELS" ] || fail "the wheel folder $WHEELS (CONTAINER_WHEELS or pip's find-links) is not a folder"
  build+=(-v "$(realpath "$WHEELS"):/wheels:ro" --build-arg PIP_FIND_LINKS=/wheels)
fi
if [ -n "$CA" ]; then
  [ -f "$CA" ] || fail "the CA bundle $CA (CONTAINER_CA or pip's cert) is not a file"
  build+=(-v "$(realpath "$CA"):/run/course-ca.crt:ro" --build-arg PIP_CERT=/run/course-ca.crt)
fi
echo "test-container: building with wheels from ${WHEELS:-PyPI and the PyTorch index}, CA bundle ${CA:-none}"
previous=$("${PODMAN[@]}" image inspect -f '{{.Id}}' "$IMAGE" 2>/dev/null || true)
phase "build image" "$LOGS/build.log" "${build[@]}" .
if [ -n "$previous" ] && [ "$previous" != "$("${PODMAN[@]}" image inspect -f '{{.Id}}' "$IMAGE")" ]; then
  "${PODMAN[@]}" rmi "$previous" >/dev/null 2>&1 || true  # the last run's image, now untagged (2 GB)
fi

# ---------------------------------------------------------------- 4. run it as a learner would
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
phase "start container" "$LOGS/start.log" "${PODMAN[@]}" run -d --name "$NAME" "${ULIMITS[@]}" \
  -p "127.0.0.1:$PORT:8888" -e "JUPYTER_TOKEN=$TOKEN" "$IMAGE"
[ "$("${PODMAN[@]}" exec "$NAME" id -u)" != 0 ] || fail "the container runs as root; the image should run as learner"

jupyterlab_answers() {  # JupyterLab's REST API with the token, then the lab page, on the published port
  local deadline=$((SECONDS + 120)) status
  until status=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/api/status?token=$TOKEN") \
        && [ "$status" = 200 ]; do
    [ $SECONDS -lt $deadline ] || { echo "no answer 200 from /api/status within 120 s (last: ${status:-none})"; return 1; }
    "${PODMAN[@]}" container exists "$NAME" && [ "$("${PODMAN[@]}" inspect -f '{{.State.Running}}' "$NAME")" = true ] \
      || { echo "the container stopped"; return 1; }
    sleep 1
  done
  echo "/api/status with the token: $status"
  status=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/api/status")
  echo "/api/status without the token: $status"
  [ "$status" = 403 ] || { echo "expected 403 without the token"; return 1; }
  local page
  page=$(curl -sf "http://127.0.0.1:$PORT/lab?token=$TOKEN") && [[ $page == *JupyterLab* ]] \
    || { echo "/lab did not return JupyterLab's page"; return 1; }
  echo "/lab with the token: JupyterLab's page"
  curl -sf "http://127.0.0.1:$PORT/api/contents/00_setup.ipynb?content=0&token=$TOKEN" >/dev/null \
    && echo "lab 00 is served from labs/" || { echo "labs/ is not JupyterLab's root"; return 1; }
}
phase "JupyterLab answers" "$LOGS/http.log" jupyterlab_answers  # timed from the start: JupyterLab's startup
cat "$LOGS/http.log"
phase "run lab 00 (nbval)" "$LOGS/lab00.log" "${PODMAN[@]}" exec "$NAME" \
  bash -c '.venv/bin/python -m pytest -p no:cacheprovider solutions/00_*.ipynb'
tail -n 1 "$LOGS/lab00.log"
echo "test-container: passed ($IMAGE on $BASE; JupyterLab answered on 127.0.0.1:$PORT)"
