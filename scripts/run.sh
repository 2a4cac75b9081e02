#!/usr/bin/env bash
# normir's main job from a fresh clone. With a GPU: the correctness check (the GPU test tier
# against float64 references) and the bandwidth table beside the peers (scripts/bench.py).
# Without one: compile every kernel for gfx950 and sm_90 and print the per-kernel report.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  python3 -m pytest tests/test_gpu_rmsnorm.py -q -m gpu
  python3 scripts/bench.py --out "${OUT:-out}" --ops fwd,bwd,fwdbwd
else
  echo "no GPU here: compiling every kernel for gfx950 and sm_90"
  normir report
fi
