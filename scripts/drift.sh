#!/usr/bin/env bash
# Drift check (never part of CI, never blocks landing): the newest versions pyproject.toml's ranges allow,
# installed into .drift/venv* (KVG_UNLOCKED=1), compared with the locks in requirements/, then the whole suite
# against them. Prints what moved, then the suite's own output; exits with the suite's status.
#   scripts/drift.sh          # all jobs (the vLLM one needs python3.11 and about 4 GB more disk)
#   scripts/drift.sh tests/unit   # only these tests, main job only (as scripts/test.sh PATH...)
# To adopt what moved: scripts/lock.sh, run ./scripts/test.sh, commit requirements/.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
export KVG_VENV_PREFIX="$ROOT/.drift/venv" KVG_UNLOCKED=1
PY=$(command -v python3.11 || command -v python3)
./scripts/setup.sh --dev --services || { echo "drift: the newest allowed versions do not install (above)" >&2; exit 3; }
echo "== what moved against the locks"
for pair in ":venv" "-tf50:tf50" "-triton:triton" "-vllm:vllm"; do
  suffix=${pair%%:*} lock=${pair#*:}
  [ -x "$KVG_VENV_PREFIX$suffix/bin/python" ] || continue
  "$PY" scripts/envlock.py diff "$KVG_VENV_PREFIX$suffix/bin/python" "requirements/$lock.txt"
done
echo "== the suite on the newest allowed versions"
./scripts/test.sh "$@"
status=$?
echo "== drift: the suite exited $status on the newest allowed versions (0: a lock refresh is safe)"
exit "$status"
