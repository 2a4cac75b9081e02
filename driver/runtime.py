"""The loader: ctypes over CUDA's cuModule*/cuLaunchKernel or HIP's hipModule*/hipModuleLaunchKernel.

One class; the vendor only picks the symbol table. Modules are loaded per (device, binary key)
into the device's primary context, which torch shares. Every return code is checked and raised
with the driver's own message. Launch arguments live in per-kernel ctypes storage that is
updated in place (no per-call allocation), under a lock so that threads cannot interleave.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass

_SYMBOLS = {
    "cuda": dict(lib=("libcuda.so.1", "libcuda.so"), init="cuInit", load="cuModuleLoadData",
                 get="cuModuleGetFunction", launch="cuLaunchKernel", error="cuGetErrorString",
                 device_get="cuDeviceGet", ctx_retain="cuDevicePrimaryCtxRetain", ctx_set="cuCtxSetCurrent",
                 occupancy="cuOccupancyMaxActiveBlocksPerMultiprocessor"),
    "hip": dict(lib=("libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.7"), init="hipInit",
                load="hipModuleLoadData", get="hipModuleGetFunction", launch="hipModuleLaunchKernel",
                error="hipGetErrorString", device_get="hipDeviceGet", ctx_retain=None, ctx_set="hipSetDevice",
                occupancy="hipModuleOccupancyMaxActiveBlocksPerMultiprocessor"),
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
        self._launch = getattr(L, s["launch"])
        self._launch.argtypes = [vp, u32, u32, u32, u32, u32, u32, u32, vp, ctypes.POINTER(vp), ctypes.POINTER(vp)]
        self._launch.restype = i32
        self._error = getattr(L, s["error"])
        if vendor == "cuda":
            self._error.argtypes, self._error.restype = [i32, ctypes.POINTER(ctypes.c_char_p)], i32
        else:
            self._error.argtypes, self._error.restype = [i32], ctypes.c_char_p
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
            raise DriverError(f"{what} failed with error {code}: {self.error_string(code)}")

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

    def occupancy(self, fn: ctypes.c_void_p, block: int) -> int:
        """How many blocks of this kernel fit on one multiprocessor at once."""
        f = getattr(self.lib, self.sym["occupancy"])
        f.argtypes, f.restype = [ctypes.POINTER(ctypes.c_int), ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t], ctypes.c_int
        n = ctypes.c_int()
        self.check(f(ctypes.byref(n), fn, block, 0), self.sym["occupancy"])
        return max(1, n.value)

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


@dataclass
class LaunchHandle:
    """A loaded kernel with its launch argument storage, prepared once."""

    driver: Driver
    fn: ctypes.c_void_p
    name: str
    block: int
    arg_kinds: tuple[str, ...]  # "p" pointer, "q" int64

    def __post_init__(self) -> None:
        ctor = {"p": ctypes.c_void_p, "q": ctypes.c_int64}
        self._vals = [ctor[k]() for k in self.arg_kinds]
        self._params = (ctypes.c_void_p * len(self._vals))(*[ctypes.addressof(v) for v in self._vals])
        self._lock = threading.Lock()
        self.blocks_per_sm = self.driver.occupancy(self.fn, self.block)

    def launch(self, grid: int, stream: int, *args: int) -> None:
        if grid <= 0:
            return
        with self._lock:
            for v, a in zip(self._vals, args):
                v.value = a
            code = self.driver._launch(self.fn, grid, 1, 1, self.block, 1, 1, 0, stream, self._params, None)
        if code != 0:
            raise DriverError(f"{self.driver.sym['launch']} ({self.name}, grid {grid}, block {self.block}) "
                              f"failed with error {code}: {self.driver.error_string(code)}")


_drivers: dict[str, Driver] = {}


def driver(vendor: str) -> Driver:
    d = _drivers.get(vendor)
    if d is None:
        d = _drivers[vendor] = Driver(vendor)
    return d
