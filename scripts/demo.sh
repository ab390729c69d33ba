#!/usr/bin/env bash
# README command 1: set up what the demo needs (idempotent), then run `kv-guardian demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec .venv/bin/kv-guardian demo "$@"
