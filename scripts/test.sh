#!/usr/bin/env bash
# All of normir's tests from a fresh clone: setup, lint, lit (IR and ISA of every kernel on
# sm_90 and gfx950), pytest (the CPU tier everywhere; the GPU tiers where a GPU is present).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
ruff check .
lit -sv lit_tests
python3 -m pytest tests -q
