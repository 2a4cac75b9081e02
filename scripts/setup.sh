#!/usr/bin/env bash
# Everything normir needs on a fresh machine: the package (editable) with the compiler (the MLIR
# bindings in flydsl) and the test tools, torch, and an ld.lld for linking gfx950 hsaco.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q -e ".[compile,test]"
if ! python3 -c "from normir import targets; targets.rocm_toolkit()" >/dev/null 2>&1; then
  echo "setup: no ld.lld for gfx hsaco; installing Debian's lld-22"
  if [ "$(id -u)" = 0 ]; then apt=apt-get; else apt="sudo apt-get"; fi
  $apt update -qq && $apt install -y -qq lld-22 >/dev/null
fi
python3 -c "from normir import targets; print('setup: hsaco linker toolkit at', targets.rocm_toolkit())"
