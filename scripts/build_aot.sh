#!/usr/bin/env bash
# Build the AOT cache folder the GPU machine loads (the GPU tier's, the benchmark's and the tuning
# script's specializations) from scratch, and check that every entry is found the way a
# runtime-only machine looks it up. Usage: bash scripts/build_aot.sh [DIR=.aot]
set -euo pipefail
dir=${1:-.aot}
tmp=$(mktemp -d)
python3 scripts/aot_plan.py "$tmp/plan.json"
python3 scripts/tune.py plan > "$tmp/tune.json"
python3 - "$tmp/plan.json" "$tmp/tune.json" "$tmp/all.json" <<'PY'
import json, sys
a = json.load(open(sys.argv[1])) + json.load(open(sys.argv[2]))
json.dump(a, open(sys.argv[3], "w"))
PY
rm -rf "$dir"
normir aot "$tmp/all.json" --out "$dir"
python3 - "$tmp/all.json" "$dir" <<'PY'
import json, sys
from pathlib import Path
from normir import cache, library
from normir.options import build
plan, root = json.load(open(sys.argv[1])), Path(sys.argv[2])
missing = [p for p in plan if cache.lookup(library.key_for(build(**p), "bin"), None, [root]) is None]
print(f"aot check: {len(plan) - len(missing)}/{len(plan)} found as a runtime-only machine would")
sys.exit(1 if missing else 0)
PY
rm -rf "$tmp"
