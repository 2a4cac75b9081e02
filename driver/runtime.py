"""The loader: ctypes over CUDA's cuModule*/cuLaunchKernel or HIP's hipModule*/hipModuleLaunchKernel.

One class; the vendor only picks the symbol table. Modules are loaded per (device, binary key)
into the device's primary context, which torch shares. Every return code is checked and raised
with the driver's own message. Launch arguments live in per-kernel ctypes storage that is
updated in place (no per-call allocation), under a lock so that threads cannot interleave.
"""

from __future__ import annotations

import contextlib
import ctypes
import operator
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from .layout import MAX_CLUSTER as _PORTABLE_CLUSTER  # the largest cluster without the attribute below

_SYMBOLS = {
    "cuda": dict(lib=("libcuda.so.1", "libcuda.so"), init="cuInit", load="cuModuleLoadData",
                 get="cuModuleGetFunction", launch="cuLaunchKernel", error="cuGetErrorString",
                 device_get="cuDeviceGet", ctx_retain="cuDevicePrimaryCtxRetain", ctx_set="cuCtxSetCurrent",
                 occupancy="cuOccupancyMaxActiveBlocksPerMultiprocessor", param_end=0,
                 launch_ex="cuLaunchKernelEx", cluster_occupancy="cuOccupancyMaxActiveClusters",
                 set_attribute="cuFuncSetAttribute", capture_mode="cuThreadExchangeStreamCaptureMode"),
    "hip": dict(lib=("libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.7"), init="hipInit",
                load="hipModuleLoadData", get="hipModuleGetFunction", launch="hipModuleLaunchKernel",
                error="hipGetErrorString", device_get="hipDeviceGet", ctx_retain=None, ctx_set="hipSetDevice",
                occupancy="hipModuleOccupancyMaxActiveBlocksPerMultiprocessor", param_end=3,
                launch_ex=None, cluster_occupancy=None, set_attribute="hipFuncSetAttribute",
                capture_mode="hipThreadExchangeStreamCaptureMode"),
}


class DriverError(RuntimeError):
    pass


class Driver:
    """The vendor driver API, reduced to what normir needs."""

    def __init__(self, vendor: str, lib: ctypes.CDLL | None = None):
        if vendor not in _SYMBOLS:
            raise ValueError(f"vendor {vendor!r}: choose 'cuda' or 'hip'")
        self.vendor = vendor
        self.sym = _SYMBOLS[vendor]
        self.lib = lib if lib is not None else self._open(self.sym["lib"])
        L, s = self.lib, self.sym
        vp, i32, u32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint
        self._load = getattr(L, s["load"])
        self._load.argtypes, self._load.restype = [ctypes.POINTER(vp), ctypes.c_char_p], i32
        self._get = getattr(L, s["get"])
        self._get.argtypes, self._get.restype = [ctypes.POINTER(vp), vp, ctypes.c_char_p], i32
        # The launch goes through a PyDLL view of the library: the GIL stays held during the
        # call (measured ~0.5 us cheaper), which also keeps other Python threads from
        # rewriting a kernel's argument buffer while the driver copies it.
        launch_lib = ctypes.PyDLL(L._name) if lib is None else L
        self._launch = getattr(launch_lib, s["launch"])
        self._launch.argtypes = [vp, u32, u32, u32, u32, u32, u32, u32, vp, ctypes.POINTER(vp), ctypes.POINTER(vp)]
        self._launch.restype = i32
        # cuLaunchKernelEx takes the geometry in one struct: 4 arguments instead of 11 (measured
        # ~1 us of host time per launch), passed as ready-made ctypes objects with no argtypes
        # for ctypes to convert through (~0.5 us more). HIP keeps the classic call.
        self._launch_ex = None
        if s["launch_ex"] and hasattr(launch_lib, s["launch_ex"]):
            self._launch_ex = getattr(launch_lib, s["launch_ex"])
            self._launch_ex.restype = i32
        self._error = getattr(L, s["error"])
        if vendor == "cuda":
            self._error.argtypes, self._error.restype = [i32, ctypes.POINTER(ctypes.c_char_p)], i32
        else:
            self._error.argtypes, self._error.restype = [i32], ctypes.c_char_p
        # cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode*): absent from a very old driver.
        self._exchange = getattr(L, s["capture_mode"], None)
        if self._exchange is not None:
            self._exchange.argtypes, self._exchange.restype = [ctypes.POINTER(ctypes.c_int)], i32
        self._modules: dict[tuple[int, str], ctypes.c_void_p] = {}
        self._lock = threading.Lock()
        self.check(getattr(L, s["init"])(0), s["init"])

    @staticmethod
    def _open(names: tuple[str, ...]) -> ctypes.CDLL:
        errors = []
        for n in names:
            try:
                return ctypes.CDLL(n)
            except OSError as e:
                errors.append(str(e))
        raise DriverError(f"cannot open the GPU driver library ({' or '.join(names)}): {'; '.join(errors)}. "
                          "Is a GPU driver installed and on the loader path (LD_LIBRARY_PATH)?")

    def error_string(self, code: int) -> str:
        if self.vendor == "cuda":
            msg = ctypes.c_char_p()
            if self._error(code, ctypes.byref(msg)) != 0 or not msg.value:
                return "unknown error"
            return msg.value.decode()
        msg = self._error(code)
        return msg.decode() if msg else "unknown error"

    def check(self, code: int, what: str) -> None:
        if code != 0:
            raise DriverError(f"{what} failed with error {code}: {self.error_string(code)}{capture_hint(code)}")

    @contextlib.contextmanager
    def relaxed_capture(self) -> Iterator[None]:
        """This thread's stream-capture mode set to relaxed, then restored: a stream capture in
        progress (torch.cuda.graph's default mode, "global") forbids this thread the calls it deems
        unsafe, which include loading a module. Loading one enqueues nothing on the capturing
        stream, so the captured graph is the same; torch's allocator relaxes the mode around its
        cudaMalloc during a capture in the same way."""
        if self._exchange is None:
            yield
            return
        mode = ctypes.c_int(_CAPTURE_MODE_RELAXED)
        self.check(self._exchange(ctypes.byref(mode)), self.sym["capture_mode"])
        try:
            yield
        finally:
            self._exchange(ctypes.byref(mode))  # the previous mode back

    def make_current(self, device: int) -> None:
        """Make the device's primary context (the one torch uses) current on this thread."""
        L, s = self.lib, self.sym
        if self.vendor == "hip":
            self.check(getattr(L, s["ctx_set"])(device), s["ctx_set"])
            return
        dev, ctx = ctypes.c_int(), ctypes.c_void_p()
        self.check(getattr(L, s["device_get"])(ctypes.byref(dev), device), s["device_get"])
        self.check(getattr(L, s["ctx_retain"])(ctypes.byref(ctx), dev), s["ctx_retain"])
        self.check(getattr(L, s["ctx_set"])(ctx), s["ctx_set"])

    def occupancy(self, fn: ctypes.c_void_p, block: int, shared_bytes: int = 0) -> int:
        """How many blocks of this kernel fit on one multiprocessor at once."""
        f = getattr(self.lib, self.sym["occupancy"])
        f.argtypes, f.restype = [ctypes.POINTER(ctypes.c_int), ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t], ctypes.c_int
        n = ctypes.c_int()
        self.check(f(ctypes.byref(n), fn, block, shared_bytes), self.sym["occupancy"])
        return max(1, n.value)

    def _set_attribute(self, fn: ctypes.c_void_p, attribute: int, value: int, what: str) -> None:
        name = self.sym["set_attribute"]
        f = getattr(self.lib, name)
        f.argtypes, f.restype = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int], ctypes.c_int
        self.check(f(fn, attribute, value), f"{name} ({what})")

    def allow_shared(self, fn: ctypes.c_void_p, shared_bytes: int) -> None:
        """Let the kernel take more dynamic shared memory than the default 48 KB."""
        self._set_attribute(fn, _MAX_DYNAMIC_SHARED_SIZE_BYTES, shared_bytes, f"{shared_bytes} bytes of shared memory")

    def allow_nonportable_cluster(self, fn: ctypes.c_void_p, cluster: int) -> None:
        """Let the kernel launch in clusters past the portable 8 blocks (H100 and H200: 16)."""
        self._set_attribute(fn, _NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1, f"clusters of {cluster} blocks, non-portable")

    def active_clusters(self, fn: ctypes.c_void_p, block: int, cluster: int, shared_bytes: int = 0) -> int:
        """How many clusters of `cluster` blocks of this kernel the whole GPU runs at once."""
        name = self.sym["cluster_occupancy"]
        if name is None or self._launch_ex is None:
            raise DriverError(f"{self.vendor} has no thread-block clusters; this kernel was built for "
                              f"clusters of {cluster} blocks (a target mismatch: check NORMIR_TARGET)")
        f = getattr(self.lib, name)
        f.argtypes, f.restype = [ctypes.POINTER(ctypes.c_int), ctypes.c_void_p, ctypes.c_void_p], ctypes.c_int
        attr = _LaunchAttribute.cluster(cluster)
        cfg = _LaunchConfig(cluster, 1, 1, block, 1, 1, shared_bytes, None, ctypes.addressof(attr), 1)
        n = ctypes.c_int()
        self.check(f(ctypes.byref(n), fn, ctypes.byref(cfg)), name)
        if n.value < 1:
            raise DriverError(f"no cluster of {cluster} blocks of {block} threads fits this GPU at once")
        return n.value

    def function(self, device: int, key: str, data: bytes, entry: str) -> ctypes.c_void_p:
        with self._lock:
            mod = self._modules.get((device, key))
            if mod is None:
                self.make_current(device)
                mod = ctypes.c_void_p()
                self.check(self._load(ctypes.byref(mod), data), f"{self.sym['load']} ({entry})")
                self._modules[(device, key)] = mod
        fn = ctypes.c_void_p()
        self.check(self._get(ctypes.byref(fn), mod, entry.encode()), f"{self.sym['get']} ({entry})")
        return fn


# CUDA_ERROR_INVALID_CONTEXT / hipErrorInvalidContext: no (valid) context current on the thread.
_INVALID_CONTEXT = 201
# CU_STREAM_CAPTURE_MODE_RELAXED / hipStreamCaptureModeRelaxed.
_CAPTURE_MODE_RELAXED = 2
# CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED ... CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD (HIP's are the same).
_CAPTURE_ERRORS = range(900, 909)


CAPTURE_HINT = (" (inside a CUDA graph capture: run the call once before capturing, a warm-up as "
                "torch.cuda.graph's documentation asks, so that normir's kernel is loaded before the capture starts)")


def capture_hint(code: int) -> str:
    """What to do about an error a CUDA graph capture caused (nothing for another error)."""
    return CAPTURE_HINT if code in _CAPTURE_ERRORS else ""
# The launch's `extra` parameter: a pointer to one packed argument buffer and its size.
_BUFFER_POINTER, _BUFFER_SIZE = 1, 2
# CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, hipFuncAttributeMaxDynamicSharedMemorySize.
_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
# CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED.
_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14


class _LaunchConfig(ctypes.Structure):
    """CUlaunchConfig (cuLaunchKernelEx's geometry): grid, block, shared bytes, stream, attributes."""

    _fields_ = [("grid_x", ctypes.c_uint), ("grid_y", ctypes.c_uint), ("grid_z", ctypes.c_uint),
                ("block_x", ctypes.c_uint), ("block_y", ctypes.c_uint), ("block_z", ctypes.c_uint),
                ("shared_bytes", ctypes.c_uint), ("stream", ctypes.c_void_p), ("attrs", ctypes.c_void_p),
                ("num_attrs", ctypes.c_uint)]


class _LaunchAttribute(ctypes.Structure):
    """CUlaunchAttribute: an id, padding to 8 bytes, then a 64-byte value union (as 16 uint32)."""

    _fields_ = [("id", ctypes.c_uint), ("pad", ctypes.c_uint), ("value", ctypes.c_uint * 16)]

    @classmethod
    def cluster(cls, x: int) -> _LaunchAttribute:
        """CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION (4): the cluster's x, y, z."""
        return cls(4, 0, (ctypes.c_uint * 16)(x, 1, 1))

    @classmethod
    def programmatic(cls) -> _LaunchAttribute:
        """CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION (6) = 1: the kernel may start
        before the one ahead of it on the stream ends; it waits for it in-kernel."""
        return cls(6, 0, (ctypes.c_uint * 16)(1))


@dataclass
class LaunchHandle:
    """A loaded kernel with its argument buffer, prepared once: a launch packs the arguments in
    the kernel's order (kernels.KernelSpec.args) into it with one struct call and hands it over
    through the launch's `extra` parameter. An argument named `grid` (last) gets the launch's
    grid size. launch_named() takes the arguments by name; launch() positionally, for hot paths."""

    driver: Driver
    fn: ctypes.c_void_p
    name: str
    block: int
    arg_names: tuple[str, ...]  # launch order
    arg_kinds: tuple[str, ...]  # "p" pointer, "q" int64: all 8 bytes, so no padding
    cluster: int = 1  # blocks per thread-block cluster (the grid is a multiple of it)
    shared_bytes: int = 0  # dynamic shared memory per block
    device: int = 0  # the device whose context the module was loaded into
    # Launched with programmatic stream serialization (cuLaunchKernelEx; the kernel waits for the
    # one ahead of it in-kernel, targets.Target.grid_dep_piece): the column sums after a row kernel.
    programmatic: bool = False

    def __post_init__(self) -> None:
        if set(self.arg_kinds) - {"p", "q"} or len(self.arg_kinds) != len(self.arg_names):
            raise ValueError(f"{self.name}: argument kinds {self.arg_kinds} must be 'p' or 'q', one per name "
                             f"{self.arg_names}")
        if "grid" in self.arg_names[:-1]:
            raise ValueError(f"{self.name}: the grid argument must come last: {self.arg_names}")
        self._with_grid = bool(self.arg_names) and self.arg_names[-1] == "grid"
        given = self.arg_names[:-1] if self._with_grid else self.arg_names
        self._given = frozenset(given)
        self._values = operator.itemgetter(*given) if len(given) > 1 else (lambda v: tuple(v[n] for n in given))
        # One buffer: the arguments, then the CUlaunchConfig (8-byte aligned after them), whose
        # first field is grid x. A launch writes the arguments and the grid with one struct call.
        size = 8 * len(self.arg_kinds)
        self._pack = struct.Struct("<" + "".join("Q" if k == "p" else "q" for k in self.arg_kinds) + "I").pack_into
        self._mem = ctypes.create_string_buffer(size + ctypes.sizeof(_LaunchConfig))
        self._size = ctypes.c_size_t(size)
        vp = ctypes.c_void_p
        self._extra = (vp * 5)(_BUFFER_POINTER, ctypes.addressof(self._mem), _BUFFER_SIZE,
                               ctypes.addressof(self._size), self.driver.sym["param_end"])
        self._fn = self.fn.value
        if self.shared_bytes:
            # Static shared variables count toward the 48 KB default too: always lift it.
            self.driver.allow_shared(self.fn, self.shared_bytes)
        self.blocks_per_sm = self.driver.occupancy(self.fn, self.block, self.shared_bytes)
        self._config = _LaunchConfig.from_buffer(self._mem, size)
        self._config.grid_y = self._config.grid_z = self._config.block_y = self._config.block_z = 1
        self._config.block_x, self._config.shared_bytes = self.block, self.shared_bytes
        self._stream = 0
        self.active_clusters = 0
        if self.cluster > _PORTABLE_CLUSTER:
            self.driver.allow_nonportable_cluster(self.fn, self.cluster)
        attrs = []
        if self.cluster > 1:
            self.active_clusters = self.driver.active_clusters(self.fn, self.block, self.cluster, self.shared_bytes)
            attrs.append(_LaunchAttribute.cluster(self.cluster))
        if self.programmatic:
            attrs.append(_LaunchAttribute.programmatic())
        if attrs:
            self._attrs = (_LaunchAttribute * len(attrs))(*attrs)
            self._config.attrs, self._config.num_attrs = ctypes.addressof(self._attrs), len(attrs)
        self._lock = threading.Lock()
        self._call = self.driver._launch_ex
        self._call_args = (vp(ctypes.addressof(self._config)), vp(self._fn), None, self._extra)

    def resident(self, sm_count: int) -> int:
        """How many clusters (or blocks, without clusters) run at once: a persistent grid's size."""
        return self.active_clusters or sm_count * self.blocks_per_sm

    def launch_named(self, grid: int, stream: int, **values: int) -> None:
        """grid: blocks, a multiple of the cluster size; values: every argument by name (but grid)."""
        try:
            args = self._values(values)
        except KeyError:
            args = None
        if args is None or len(values) != len(self._given):
            raise TypeError(f"{self.name} takes the arguments {sorted(self._given)}; given {sorted(values)}")
        self.launch(grid, stream, *args)

    def launch(self, grid: int, stream: int, *args: int) -> None:
        """grid: blocks, a multiple of the cluster size; args: every argument but grid, in the
        order of arg_names (the hot path: no names to look up)."""
        if grid <= 0:
            return
        code = self._launch(grid, stream, args)
        if code == _INVALID_CONTEXT:
            # A thread with no current context (torch's autograd threads make none current
            # until a runtime call of theirs needs one): make the device's current, once.
            self.driver.make_current(self.device)
            code = self._launch(grid, stream, args)
        if code != 0:
            raise DriverError(f"{self.driver.sym['launch']} ({self.name}, grid {grid}, block {self.block}) "
                              f"failed with error {code}: {self.driver.error_string(code)}{capture_hint(code)}")

    def _launch(self, grid: int, stream: int, args: tuple[int, ...]) -> int:
        with self._lock:  # another thread must not rewrite the buffer before the driver copies it
            if self._with_grid:
                self._pack(self._mem, 0, *args, grid, grid)
            else:
                self._pack(self._mem, 0, *args, grid)
            if self._call is not None:
                if stream != self._stream:
                    self._config.stream = self._stream = stream
                return self._call(*self._call_args)
            return self.driver._launch(self._fn, grid, 1, 1, self.block, 1, 1, self.shared_bytes, stream, None,
                                       self._extra)


_drivers: dict[str, Driver] = {}


def driver(vendor: str) -> Driver:
    d = _drivers.get(vendor)
    if d is None:
        d = _drivers[vendor] = Driver(vendor)
    return d
