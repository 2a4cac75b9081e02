# lit configuration for normir's IR and ISA tests: `lit -v lit_tests` from the repository root.
# Each test compiles a kernel with the normir CLI and checks one stage (input, isa, bin) with
# FileCheck. No GPU is needed; ptxas and llvm-readelf, where present, add checks (%if ptxas, ...).

import os
import re
import shutil
import sys

import lit.formats

config.name = "normir"
# lit's internal shell (lit 23 deprecates the external one); it has `not` built in.
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".test", ".mlir"]
config.excludes = ["Inputs", "Output"]
config.test_source_root = os.path.dirname(__file__)

repo_root = os.path.dirname(config.test_source_root)

# The compiler caches (and links its hsaco toolkit) under ~/.cache/normir unless NORMIR_* says
# otherwise; PATH finds ptxas and ld.lld; the rest locate toolkits.
for var in ("HOME", "PATH", "TMPDIR", "ROCM_PATH", "CUDA_HOME", "CUDA_PATH", "PYTHONPATH"):
    if var in os.environ:
        config.environment[var] = os.environ[var]
for var, value in os.environ.items():
    if var.startswith("NORMIR_"):
        config.environment[var] = value
config.environment["FILECHECK_OPTS"] = "-enable-var-scope --allow-unused-prefixes=false"


def find_tool(*names):
    """A tool next to this Python (pip console scripts), else on PATH."""
    for name in names:
        local = os.path.join(os.path.dirname(sys.executable), name)
        if os.path.isfile(local) and os.access(local, os.X_OK):
            return local
        found = shutil.which(name, path=os.environ.get("PATH", ""))
        if found:
            return found
    return None


def tool_subst(name, command):
    """Replace `name` where it starts a command word of a RUN line (not inside paths or options)."""
    config.substitutions.append((r"(?<![^\s|])" + re.escape(name) + r"(?=\s|$)", command))


python = f'"{sys.executable}"'
filecheck = find_tool("FileCheck")
if filecheck is None:
    lit_config.fatal("FileCheck not found: `pip install llvm-testing-tools` (or put FileCheck on PATH)")

config.substitutions.append(("%kernels", os.path.join(repo_root, "mlir")))
config.substitutions.append(("%python", python))
tool_subst("normir", f"{python} -m normir.cli")
tool_subst("FileCheck", f'"{filecheck}"')

ptxas = os.environ.get("NORMIR_PTXAS") or find_tool("ptxas")
if ptxas:
    config.available_features.add("ptxas")
    tool_subst("ptxas", f'"{ptxas}"')

readelf = find_tool("llvm-readelf", "llvm-readelf-22", "llvm-readelf-21", "llvm-readelf-20")
if readelf:
    config.available_features.add("llvm-readelf")
    tool_subst("llvm-readelf", f'"{readelf}"')
