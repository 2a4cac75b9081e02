"""The layout policy: (problem, overrides, target, the kernel's catalogue entry) -> Layout, how
threads cover rows. geometry.py covers a row; rules.py holds the measured rules as records and
their declared order; forced.py applies and checks the knobs a caller forced; chooser.py applies
them all and names the rules that fired. Decisions come from data about the kernel
(kernels.RowWork, kernels.Stats, its grid), never from its name.
"""

from .chooser import decide
from .geometry import DTYPES, MAX_CLUSTER, MAX_THREADS, MAX_VECTOR_BYTES, Layout, max_vec

__all__ = ["DTYPES", "MAX_CLUSTER", "MAX_THREADS", "MAX_VECTOR_BYTES", "Layout", "decide", "max_vec"]
