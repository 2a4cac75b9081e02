"""Write the AOT plan (a JSON list of Problem and Overrides fields) for the GPU tier and the benchmark.

    python scripts/aot_plan.py plan.json && normir aot plan.json --out .aot
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from gpu_cases import specializations  # noqa: E402

if __name__ == "__main__":
    plan = specializations()
    Path(sys.argv[1]).write_text(json.dumps(plan, indent=0))
    print(f"{len(plan)} specializations -> {sys.argv[1]}")
