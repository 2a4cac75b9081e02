"""Print, or with --write store, the pinned PTX/ISA hashes of tests/test_isa_pins.py.

    python3 scripts/pin_isa.py            # differences against tests/isa_pins.json
    python3 scripts/pin_isa.py --write    # after a benchmark run backs the new code
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from test_isa_pins import PINS, current  # noqa: E402

if __name__ == "__main__":
    now = current()
    old = json.loads(PINS.read_text()) if PINS.is_file() else {}
    changed = sorted(k for k in now if old.get(k) != now[k])
    print(f"{len(now)} pins, {len(changed)} changed: {', '.join(changed) or 'none'}")
    if "--write" in sys.argv[1:]:
        PINS.write_text(json.dumps(now, indent=1, sort_keys=True) + "\n")
        print(f"wrote {PINS}")
