#!/usr/bin/env bash
# normir's main job from a fresh clone. With a GPU: the correctness check (the GPU test tier
# against float64 references) and the bandwidth table beside the peers (scripts/bench.py).
# Without one: compile every kernel for gfx950 and sm_90 and print the per-kernel report.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  python3 -m pytest tests/test_gpu_rmsnorm.py tests/test_gpu_fused_add.py tests/test_gpu_layernorm.py -q -m gpu
  python3 scripts/bench.py --out "${OUT:-out}" --ops fwd,bwd,add_fwd,add_bwd,ln_fwd,ln_bwd,add_ln_fwd,add_ln_bwd
else
  echo "no GPU here: compiling every kernel for gfx950 and sm_90"
  normir report
fi
