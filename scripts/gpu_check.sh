#!/usr/bin/env bash
# The GPU tier on a machine without MLIR bindings: install normir (no deps, offline), load the
# kernels from the AOT folder (.aot, made by `normir aot`), run the GPU tests and the
# compute-sanitizer checks. Usage: bash scripts/gpu_check.sh OUTDIR [pytest -k expression]
set -uo pipefail
out=${1:-out}; mkdir -p "$out"
python3 -m pip install -q --no-deps --no-build-isolation --no-index . >"$out/install.log" 2>&1 || { cat "$out/install.log"; exit 1; }
export NORMIR_AOT_DIRS=$PWD/.aot NORMIR_CACHE_DIR=/tmp/normir-cache NORMIR_NO_COMPILE=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
sel=${2:-}
python3 -m pytest tests/test_gpu_rmsnorm.py -m "gpu and not multi_gpu" -q -p no:cacheprovider ${sel:+-k "$sel"} --junitxml="$out/gpu-tests.xml" 2>&1 | tail -n 40 | tee "$out/gpu-tests.txt"
rc=${PIPESTATUS[0]}
if [ "${SANITIZE:-1}" = 1 ]; then
  for tool in memcheck racecheck; do
    compute-sanitizer --tool $tool --error-exitcode 3 python3 scripts/sanitize.py >"$out/sanitizer-$tool.txt" 2>&1
    echo "compute-sanitizer $tool: exit $? ($(grep -c 'FAIL' "$out/sanitizer-$tool.txt") FAIL lines; $(tail -n 1 "$out/sanitizer-$tool.txt"))"
  done
fi
exit $rc
