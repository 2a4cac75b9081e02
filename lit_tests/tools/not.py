"""`not CMD ARGS...`: succeed when CMD fails with an ordinary error exit (as LLVM's `not`).

A crash (killed by a signal) is still a failure, so a test expecting an error message cannot
pass on a compiler crash."""

import subprocess
import sys

if len(sys.argv) < 2:
    sys.exit("usage: not.py CMD [ARGS...]")
rc = subprocess.call(sys.argv[1:])
sys.exit(0 if rc > 0 else 1)
