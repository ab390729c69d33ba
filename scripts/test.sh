#!/usr/bin/env bash
# README command 2: set up everything the tests need (idempotent: virtualenv, packages, system services),
# then run the whole test suite. In CI (CI=true) a missing service fails its tests instead of skipping them.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh --dev --services
exec .venv/bin/python -m pytest -n 2 --dist loadfile "$@"
