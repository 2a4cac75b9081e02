#!/usr/bin/env bash
# The GPU tier on a machine without MLIR bindings: install normir (no deps, offline), load the
# kernels from the AOT folder (.aot, made by scripts/build_aot.sh), run the GPU tests and the
# compute-sanitizer checks. Usage: bash scripts/gpu_check.sh OUTDIR [pytest -k expression]
# Writes OUTDIR/gpu-tests.txt and, unless SANITIZE=0, OUTDIR/sanitizer-{memcheck,racecheck}.txt.
set -uo pipefail
out=${1:-out}; mkdir -p "$out"
python3 -m pip install -q --no-deps --no-build-isolation --no-index . >/tmp/normir-install.log 2>&1 \
  || { cat /tmp/normir-install.log; exit 1; }
# NORMIR_NO_COMPILE=0 (with the MLIR bindings on PYTHONPATH) compiles what .aot lacks instead of failing;
# the specializations compiled that way are listed in OUTDIR/compiled-here.txt.
export NORMIR_AOT_DIRS=$PWD/.aot NORMIR_CACHE_DIR=/tmp/normir-cache NORMIR_NO_COMPILE=${NORMIR_NO_COMPILE:-1} \
  PYTHONUNBUFFERED=1
sel=${2:-}
{
  date -u +%Y-%m-%dT%H:%MZ
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -m pytest tests/test_gpu_*.py -m "${MARKERS:-gpu and not multi_gpu}" -q -p no:cacheprovider -rfE ${sel:+-k "$sel"} 2>&1
} > "$out/gpu-tests.txt"
rc=$?
tail -n 15 "$out/gpu-tests.txt"
find /tmp/normir-cache -name "*.json" -exec cat {} + > "$out/compiled-here.txt" 2>/dev/null
if [ "${SANITIZE:-1}" = 1 ]; then
  for tool in memcheck racecheck; do
    compute-sanitizer --tool $tool --error-exitcode 3 python3 scripts/sanitize.py >"$out/sanitizer-$tool.txt" 2>&1
    echo "compute-sanitizer $tool: exit $? ($(grep -c 'FAIL' "$out/sanitizer-$tool.txt") FAIL lines; $(tail -n 1 "$out/sanitizer-$tool.txt"))"
  done
fi
exit $rc
