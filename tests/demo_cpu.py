"""scripts/train_demo.py with normir's launches emulated on the CPU (cpu_emulation.py): the CPU
tier's run of the demo's wiring, under torchrun or as one process, with the demo's own arguments:

    torchrun --nproc-per-node 2 tests/demo_cpu.py --device cpu --mode tp --steps 3 --out /tmp/demo
"""

import runpy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cpu_emulation  # noqa: E402

DEMO = Path(__file__).resolve().parent.parent / "scripts" / "train_demo.py"

if __name__ == "__main__":
    cpu_emulation.install()
    sys.argv[0] = str(DEMO)
    runpy.run_path(str(DEMO), run_name="__main__")
