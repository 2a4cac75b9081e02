"""The ctypes loader without a GPU: opening a missing driver library, and the CUDA/HIP code paths
driven through fake driver libraries (return codes, out-parameters, error strings, launch storage)."""

from __future__ import annotations

import ctypes

import pytest

from normir import runtime
from normir.runtime import Driver, DriverError, LaunchHandle

pytestmark = pytest.mark.cpu


def _loadable(names: tuple[str, ...]) -> bool:
    for n in names:
        try:
            ctypes.CDLL(n)
            return True
        except OSError:
            pass
    return False


# ---------------------------------------------------------------------------- fake driver libraries


def _set_out(ref, value) -> None:
    """Write through a ctypes.byref(...) out-parameter, as the C function would."""
    ref._obj.value = value


class FakeFn:
    def __init__(self, lib: FakeLib, name: str):
        self.lib, self.name = lib, name
        self.argtypes = None
        self.restype = None

    def __call__(self, *args):
        self.lib.calls.append((self.name, args))
        return getattr(self.lib, "_" + self.name)(*args)


class FakeLib:
    """Just the symbols normir uses; an unknown symbol is an AttributeError, as with a real CDLL."""

    SYMBOLS: tuple[str, ...] = ()

    def __init__(self, **codes: int):
        self.codes = codes  # symbol -> return code (default 0)
        self.calls: list[tuple[str, tuple]] = []
        self.fns = {n: FakeFn(self, n) for n in self.SYMBOLS}
        self.launches: list[dict] = []
        self.occupancy_value = 3
        self.next_handle = 0x1000

    def __getattr__(self, name):
        fns = self.__dict__.get("fns", {})
        if name in fns:
            return fns[name]
        raise AttributeError(name)

    def called(self, name: str) -> list[tuple]:
        return [args for n, args in self.calls if n == name]

    def code(self, name: str) -> int:
        """The symbol's return code; a list gives one code per call (its last one thereafter)."""
        c = self.codes.get(name, 0)
        if isinstance(c, list):
            return c.pop(0) if len(c) > 1 else c[0]
        return c

    def _handle(self) -> int:
        self.next_handle += 0x10
        return self.next_handle

    def _record_launch(self, fn, gx, gy, gz, bx, by, bz, shmem, stream, params, extra, n_args=None):
        # The arguments arrive packed in one buffer through `extra`:
        # {BUFFER_POINTER, &buf, BUFFER_SIZE, &size, END}.
        assert params is None and extra[0] == 1 and extra[2] == 2
        size = ctypes.c_size_t.from_address(extra[3]).value
        values = [ctypes.c_uint64.from_address(extra[1] + 8 * i).value for i in range(size // 8)]
        self.launches.append(dict(fn=fn, grid=(gx, gy, gz), block=(bx, by, bz), shmem=shmem, stream=stream,
                                  params=extra[1], extra=extra, end=extra[4] or 0, values=values))


def _attrs(config: int) -> list[tuple[int, int, int, int]]:
    """CUlaunchConfig's attributes (at byte 40, their count at 48) as (id, x, y, z): each is 72
    bytes, the id then the value union from byte 8."""
    ptr = ctypes.c_void_p.from_address(config + 40).value
    count = ctypes.c_uint.from_address(config + 48).value
    return [tuple(ctypes.c_uint.from_address(ptr + 72 * i + off).value for off in (0, 8, 12, 16))
            for i in range(count)]


MESSAGES = {100: "no CUDA-capable device is detected", 218: "a PTX JIT compilation failed",
            700: "an illegal memory access was encountered", 900: "operation not permitted when stream is capturing"}


class FakeCuda(FakeLib):
    SYMBOLS = ("cuInit", "cuModuleLoadData", "cuModuleGetFunction", "cuLaunchKernel", "cuGetErrorString",
               "cuDeviceGet", "cuDevicePrimaryCtxRetain", "cuCtxSetCurrent",
               "cuOccupancyMaxActiveBlocksPerMultiprocessor", "cuLaunchKernelEx", "cuOccupancyMaxActiveClusters",
               "cuFuncSetAttribute", "cuThreadExchangeStreamCaptureMode")

    capture_mode = 0  # CU_STREAM_CAPTURE_MODE_GLOBAL, the thread's default

    def _cuThreadExchangeStreamCaptureMode(self, mode):
        mode._obj.value, self.capture_mode = self.capture_mode, mode._obj.value
        return self.code("cuThreadExchangeStreamCaptureMode")

    def _cuInit(self, flags):
        return self.code("cuInit")

    def _cuModuleLoadData(self, mod, data):
        if not self.code("cuModuleLoadData"):
            _set_out(mod, self._handle())
        return self.code("cuModuleLoadData")

    def _cuModuleGetFunction(self, fn, mod, name):
        _set_out(fn, self._handle())
        return self.code("cuModuleGetFunction")

    def _cuLaunchKernel(self, *args):
        self._record_launch(*args)
        return self.code("cuLaunchKernel")

    def _cuLaunchKernelEx(self, config, fn, params, extra):
        # The handle passes ctypes objects (no argtypes): the config's and the function's addresses.
        config, fn = config.value, fn.value
        # CUlaunchConfig: grid x/y/z, block x/y/z, shared bytes (uint32 each), stream at 32.
        u32 = [ctypes.c_uint.from_address(config + 4 * i).value for i in range(7)]
        stream = ctypes.c_void_p.from_address(config + 32).value or 0
        self._record_launch(fn, *u32, stream, params, extra)
        self.launches[-1]["attrs"] = _attrs(config)
        return self.code("cuLaunchKernel")

    def _cuFuncSetAttribute(self, fn, attr, value):
        return self.code("cuFuncSetAttribute")

    def _cuOccupancyMaxActiveClusters(self, n, fn, config):
        # The fake GPU runs 132 blocks at once, in whole clusters of the configured size.
        (attr,) = _attrs(ctypes.addressof(config._obj))
        assert attr[0] == 4 and ctypes.c_uint.from_address(ctypes.addressof(config._obj)).value == attr[1]
        _set_out(n, 132 // attr[1])
        return self.code("cuOccupancyMaxActiveClusters")

    def _cuGetErrorString(self, code, msg):
        if code not in MESSAGES:
            return 1  # CUDA_ERROR_INVALID_VALUE
        _set_out(msg, MESSAGES[code].encode())
        return 0

    def _cuDeviceGet(self, dev, ordinal):
        _set_out(dev, ordinal)
        return self.code("cuDeviceGet")

    def _cuDevicePrimaryCtxRetain(self, ctx, dev):
        _set_out(ctx, 0xC0 + dev.value)
        return self.code("cuDevicePrimaryCtxRetain")

    def _cuCtxSetCurrent(self, ctx):
        return self.code("cuCtxSetCurrent")

    def _cuOccupancyMaxActiveBlocksPerMultiprocessor(self, n, fn, block, smem):
        _set_out(n, self.occupancy_value)
        return self.code("cuOccupancyMaxActiveBlocksPerMultiprocessor")


class FakeHip(FakeLib):
    SYMBOLS = ("hipInit", "hipModuleLoadData", "hipModuleGetFunction", "hipModuleLaunchKernel",
               "hipGetErrorString", "hipDeviceGet", "hipSetDevice",
               "hipModuleOccupancyMaxActiveBlocksPerMultiprocessor", "hipFuncSetAttribute",
               "hipThreadExchangeStreamCaptureMode")

    def _hipThreadExchangeStreamCaptureMode(self, mode):
        return 0

    def _hipInit(self, flags):
        return self.code("hipInit")

    def _hipModuleLoadData(self, mod, data):
        _set_out(mod, self._handle())
        return self.code("hipModuleLoadData")

    def _hipModuleGetFunction(self, fn, mod, name):
        _set_out(fn, self._handle())
        return self.code("hipModuleGetFunction")

    def _hipModuleLaunchKernel(self, *args):
        self._record_launch(*args)
        return self.code("hipModuleLaunchKernel")

    def _hipGetErrorString(self, code):
        return {1: b"hipErrorInvalidValue", 719: b"hipErrorLaunchFailure"}.get(code)

    def _hipDeviceGet(self, dev, ordinal):
        return 0

    def _hipSetDevice(self, device):
        return self.code("hipSetDevice")

    def _hipFuncSetAttribute(self, fn, attr, value):
        return 0

    def _hipModuleOccupancyMaxActiveBlocksPerMultiprocessor(self, n, fn, block, smem):
        _set_out(n, self.occupancy_value)
        return 0


# ---------------------------------------------------------------------------- opening the library


@pytest.mark.parametrize("vendor, lib", [("cuda", "libcuda.so.1"), ("hip", "libamdhip64.so")])
def test_missing_driver_library(vendor, lib):
    if _loadable(runtime._SYMBOLS[vendor]["lib"]):
        pytest.skip(f"{lib} is installed on this machine")
    with pytest.raises(DriverError, match=r"cannot open the GPU driver library") as e:
        Driver(vendor)
    assert lib in str(e.value)
    assert "LD_LIBRARY_PATH" in str(e.value)


def test_driver_singleton_not_cached_on_failure(monkeypatch):
    if _loadable(runtime._SYMBOLS["cuda"]["lib"]):
        pytest.skip("libcuda is installed on this machine")
    monkeypatch.setattr(runtime, "_drivers", {})
    with pytest.raises(DriverError):
        runtime.driver("cuda")
    assert runtime._drivers == {}


def test_unknown_vendor():
    with pytest.raises(ValueError, match=r"vendor 'nope': choose 'cuda' or 'hip'"):
        Driver("nope")
    with pytest.raises(ValueError, match="vendor 'nope'"):
        Driver("nope", lib=FakeCuda())


def test_fake_libs_cover_the_symbol_tables():
    for vendor, fake in (("cuda", FakeCuda), ("hip", FakeHip)):
        names = {v for k, v in runtime._SYMBOLS[vendor].items() if k not in ("lib", "param_end") and v}
        assert names <= set(fake.SYMBOLS), names - set(fake.SYMBOLS)


# ---------------------------------------------------------------------------- CUDA through the fake


def test_cuda_init_and_signatures():
    lib = FakeCuda()
    d = Driver("cuda", lib=lib)
    assert lib.called("cuInit") == [(0,)]
    assert lib.cuModuleLoadData.restype is ctypes.c_int
    assert lib.cuModuleLoadData.argtypes[1] is ctypes.c_char_p
    assert lib.cuGetErrorString.argtypes == [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    assert len(lib.cuLaunchKernel.argtypes) == 11
    assert d.error_string(700) == "an illegal memory access was encountered"
    assert d.error_string(12345) == "unknown error"  # cuGetErrorString itself failed


def test_cuda_init_failure_carries_driver_message():
    with pytest.raises(DriverError, match=r"^cuInit failed with error 100: no CUDA-capable device is detected$"):
        Driver("cuda", lib=FakeCuda(cuInit=100))


def test_cuda_function_loads_module_once():
    lib = FakeCuda()
    d = Driver("cuda", lib=lib)
    f1 = d.function(1, "key-a", b"cubin-a", "rmsnorm_fwd")
    f2 = d.function(1, "key-a", b"cubin-a", "rmsnorm_fwd")
    assert f1.value and f2.value
    assert len(lib.called("cuModuleLoadData")) == 1
    assert lib.called("cuModuleLoadData")[0][1] == b"cubin-a"
    assert [args[2] for args in lib.called("cuModuleGetFunction")] == [b"rmsnorm_fwd", b"rmsnorm_fwd"]
    # The primary context of device 1 was made current before loading.
    assert lib.called("cuDeviceGet")[0][1] == 1
    assert lib.called("cuCtxSetCurrent")[0][0].value == 0xC1
    # Another device or another binary: another module.
    d.function(0, "key-a", b"cubin-a", "rmsnorm_fwd")
    d.function(1, "key-b", b"cubin-b", "rmsnorm_bwd")
    assert len(lib.called("cuModuleLoadData")) == 3


def test_cuda_load_failure_is_not_cached():
    lib = FakeCuda(cuModuleLoadData=218)
    d = Driver("cuda", lib=lib)
    with pytest.raises(DriverError, match=r"^cuModuleLoadData \(rmsnorm_fwd\) failed with error 218: "
                                          r"a PTX JIT compilation failed$"):
        d.function(0, "k", b"bad", "rmsnorm_fwd")
    lib.codes.clear()
    assert d.function(0, "k", b"good", "rmsnorm_fwd").value
    assert len(lib.called("cuModuleLoadData")) == 2


def test_cuda_context_failure():
    d = Driver("cuda", lib=FakeCuda(cuDevicePrimaryCtxRetain=100))
    with pytest.raises(DriverError, match=r"^cuDevicePrimaryCtxRetain failed with error 100"):
        d.function(0, "k", b"x", "rmsnorm_fwd")


def _handle(lib: FakeLib, vendor: str = "cuda", names=("a", "b", "n"), kinds=("p", "p", "q")) -> LaunchHandle:
    d = Driver(vendor, lib=lib)
    fn = d.function(0, "k", b"bin", "rmsnorm_fwd")
    return LaunchHandle(d, fn, "rmsnorm_fwd", 256, names, kinds)


def test_launch_passes_arguments_in_place():
    lib = FakeCuda()
    h = _handle(lib)
    assert h.blocks_per_sm == 3
    occ = lib.called("cuOccupancyMaxActiveBlocksPerMultiprocessor")
    assert occ[0][2:] == (256, 0)
    h.launch_named(7, 0xABC, a=0x7F0000001000, b=0, n=1 << 40)
    h.launch_named(9, 0, n=5, b=0x7F0000003000, a=0x7F0000002000)  # by name, in the kernel's order
    first, second = lib.launches
    assert first["grid"] == (7, 1, 1) and first["block"] == (256, 1, 1) and first["shmem"] == 0
    assert first["stream"] == 0xABC and first["end"] == 0  # CU_LAUNCH_PARAM_END
    assert first["values"] == [0x7F0000001000, 0, 1 << 40]
    assert second["grid"] == (9, 1, 1)
    assert second["values"] == [0x7F0000002000, 0x7F0000003000, 5]
    assert first["params"] == second["params"]  # one argument buffer, packed in place


def test_launch_positional_in_the_kernel_order():
    lib = FakeCuda()
    h = _handle(lib, names=("a", "n", "grid"), kinds=("p", "q", "q"))
    h.launch(6, 0, 16, 3)  # a, n: the hot path's form
    h.launch_named(6, 0, n=3, a=16)
    assert lib.launches[0]["values"] == lib.launches[1]["values"] == [16, 3, 6]


def test_launch_without_a_current_context_makes_it_current_once():
    # A thread with no current context (torch's autograd threads): the launch fails with
    # CUDA_ERROR_INVALID_CONTEXT, the device's context is made current, and the launch retried.
    lib = FakeCuda(cuLaunchKernel=[201, 0])
    h = _handle(lib)
    before = len(lib.called("cuCtxSetCurrent"))
    h.launch(2, 0, 1, 2, 3)
    assert len(lib.called("cuCtxSetCurrent")) == before + 1 and len(lib.launches) == 2
    lib.codes["cuLaunchKernel"] = [201]  # still failing after that: reported
    with pytest.raises(DriverError, match="failed with error 201"):
        h.launch(2, 0, 1, 2, 3)


def test_launch_negative_int64():
    lib = FakeCuda()
    h = _handle(lib, names=("n",), kinds=("q",))
    h.launch_named(1, 0, n=-1)
    assert lib.launches[0]["values"] == [(1 << 64) - 1]


def test_launch_fills_the_grid_argument_and_checks_names():
    lib = FakeCuda()
    h = _handle(lib, names=("a", "n", "grid"), kinds=("p", "q", "q"))
    h.launch_named(6, 0, a=16, n=3)
    assert lib.launches[0]["values"] == [16, 3, 6]
    with pytest.raises(TypeError, match=r"takes the arguments \['a', 'n'\]; given \['a'\]"):
        h.launch_named(6, 0, a=16)
    with pytest.raises(TypeError, match=r"given \['a', 'm', 'n'\]"):
        h.launch_named(6, 0, a=16, n=3, m=1)
    with pytest.raises(ValueError, match="the grid argument must come last"):
        _handle(lib, names=("grid", "a"), kinds=("q", "p"))


@pytest.mark.parametrize("grid", [0, -3])
def test_launch_empty_grid_does_nothing(grid):
    lib = FakeCuda(cuLaunchKernel=700)
    h = _handle(lib)
    h.launch_named(grid, 0, a=1, b=2, n=3)
    assert lib.called("cuLaunchKernel") == [] and lib.launches == []


def test_launch_error_carries_driver_message():
    lib = FakeCuda(cuLaunchKernel=700)
    h = _handle(lib)
    with pytest.raises(DriverError) as e:
        h.launch_named(5, 0, a=1, b=2, n=3)
    assert str(e.value) == ("cuLaunchKernel (rmsnorm_fwd, grid 5, block 256) failed with error 700: "
                            "an illegal memory access was encountered")


def test_cluster_launch_carries_the_cluster_dimension():
    lib = FakeCuda()
    d = Driver("cuda", lib=lib)
    h = LaunchHandle(d, d.function(0, "k", b"bin", "rmsnorm_bwd"), "rmsnorm_bwd", 512, ("a",), ("p",), cluster=4)
    assert h.active_clusters == 33 and h.resident(132) == 33  # clusters, not blocks
    h.launch_named(8, 0, a=1)
    assert lib.launches[0]["grid"] == (8, 1, 1)
    assert lib.launches[0]["attrs"] == [(4, 4, 1, 1)]  # CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    plain = _handle(lib)
    assert plain.resident(132) == 132 * 3
    plain.launch_named(1, 0, a=1, b=2, n=3)
    assert lib.launches[1]["attrs"] == []


def test_programmatic_launch_carries_its_attribute():
    # The column sums start before the row kernel ends: CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_
    # SERIALIZATION (6) = 1, beside a cluster's dimension where there is one.
    lib = FakeCuda()
    d = Driver("cuda", lib=lib)
    fn = d.function(0, "k", b"bin", "rmsnorm_dw_reduce")
    LaunchHandle(d, fn, "rmsnorm_dw_reduce", 256, ("a",), ("p",), programmatic=True).launch_named(3, 0, a=1)
    assert lib.launches[0]["attrs"] == [(6, 1, 0, 0)]
    LaunchHandle(d, fn, "k", 256, ("a",), ("p",), cluster=2, programmatic=True).launch_named(4, 0, a=1)
    assert lib.launches[1]["attrs"] == [(4, 2, 1, 1), (6, 1, 0, 0)]


def test_cluster_past_the_portable_size_asks_for_a_non_portable_one():
    # CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED (14) = 1, before the cluster occupancy
    # query and the launch, only past 8 blocks.
    lib = FakeCuda()
    d = Driver("cuda", lib=lib)
    fn = d.function(0, "k", b"bin", "rmsnorm_bwd")
    LaunchHandle(d, fn, "rmsnorm_bwd", 256, ("a",), ("p",), cluster=8)
    assert lib.called("cuFuncSetAttribute") == []
    h = LaunchHandle(d, fn, "rmsnorm_bwd", 256, ("a",), ("p",), cluster=16)
    assert [args[1:] for args in lib.called("cuFuncSetAttribute")] == [(14, 1)]
    h.launch_named(16, 0, a=1)
    assert lib.launches[0]["attrs"] == [(4, 16, 1, 1)]


@pytest.mark.parametrize("vendor, fake, setattr_name", [("cuda", lambda: FakeCuda(), "cuFuncSetAttribute"),
                                                        ("hip", lambda: FakeHip(), "hipFuncSetAttribute")])
def test_dynamic_shared_memory(vendor, fake, setattr_name):
    lib = fake()
    d = Driver(vendor, lib=lib)
    occupancy = runtime._SYMBOLS[vendor]["occupancy"]
    LaunchHandle(d, d.function(0, "k", b"bin", "rmsnorm_fwd"), "rmsnorm_fwd", 512, ("a",), ("p",))
    assert lib.called(setattr_name) == []  # no dynamic shared memory: nothing to lift
    fn = d.function(0, "k", b"bin", "rmsnorm_bwd")
    small = LaunchHandle(d, fn, "rmsnorm_bwd", 512, ("a",), ("p",), shared_bytes=24576)
    big = LaunchHandle(d, fn, "rmsnorm_bwd", 512, ("a",), ("p",), shared_bytes=131072)
    # MAX_DYNAMIC_SHARED_SIZE_BYTES, for any amount (static shared memory counts toward 48 KB too)
    assert [args[1:] for args in lib.called(setattr_name)] == [(8, 24576), (8, 131072)]
    assert [args[3] for args in lib.called(occupancy)][-2:] == [24576, 131072]
    small.launch_named(3, 0, a=1)
    big.launch_named(3, 0, a=1)
    assert [launch["shmem"] for launch in lib.launches] == [24576, 131072]


def test_shared_memory_refused_is_reported():
    d = Driver("cuda", lib=FakeCuda(cuFuncSetAttribute=1))
    with pytest.raises(DriverError, match=r"^cuFuncSetAttribute \(131072 bytes of shared memory\) failed with error 1"):
        LaunchHandle(d, d.function(0, "k", b"bin", "rmsnorm_bwd"), "rmsnorm_bwd", 512, ("a",), ("p",), shared_bytes=131072)


def test_cluster_kernel_on_hip_is_refused():
    d = Driver("hip", lib=FakeHip())
    with pytest.raises(DriverError, match=r"^hip has no thread-block clusters"):
        LaunchHandle(d, d.function(0, "k", b"bin", "rmsnorm_bwd"), "rmsnorm_bwd", 512, ("a",), ("p",), cluster=2)


def test_occupancy_at_least_one():
    lib = FakeCuda()
    lib.occupancy_value = 0
    assert _handle(lib).blocks_per_sm == 1


def test_occupancy_failure():
    with pytest.raises(DriverError, match=r"^cuOccupancyMaxActiveBlocksPerMultiprocessor failed with error 700"):
        _handle(FakeCuda(cuOccupancyMaxActiveBlocksPerMultiprocessor=700))


# ---------------------------------------------------------------------------- CUDA graph capture


def test_relaxed_capture_sets_and_restores_the_thread_mode():
    lib = FakeCuda()
    d = Driver("cuda", lib=lib)
    with d.relaxed_capture():
        assert lib.capture_mode == 2  # CU_STREAM_CAPTURE_MODE_RELAXED while loading
    assert lib.capture_mode == 0  # the previous mode back
    with pytest.raises(DriverError), d.relaxed_capture():  # an error inside: the mode is restored anyway
        d.function(0, "k", b"x", "rmsnorm_fwd")
        raise DriverError("x")
    assert lib.capture_mode == 0 and len(lib.called("cuThreadExchangeStreamCaptureMode")) == 4


def test_relaxed_capture_without_the_symbol_is_a_no_op():
    class OldCuda(FakeCuda):
        SYMBOLS = tuple(s for s in FakeCuda.SYMBOLS if s != "cuThreadExchangeStreamCaptureMode")

    lib = OldCuda()
    with Driver("cuda", lib=lib).relaxed_capture():
        pass
    assert lib.capture_mode == 0


def test_capture_errors_name_the_fix():
    # A call that a capture refuses (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) says to warm up first.
    with pytest.raises(DriverError, match=r"^cuModuleLoadData \(rmsnorm_fwd\) failed with error 900: operation not "
                                          r"permitted when stream is capturing \(inside a CUDA graph capture: run the "
                                          r"call once before capturing"):
        Driver("cuda", lib=FakeCuda(cuModuleLoadData=900)).function(0, "k", b"x", "rmsnorm_fwd")
    h = _handle(FakeCuda())
    h.driver.lib.codes["cuLaunchKernel"] = 901
    with pytest.raises(DriverError, match=r"failed with error 901: unknown error \(inside a CUDA graph capture"):
        h.launch(1, 0, 1, 2, 3)
    assert runtime.capture_hint(700) == "" and runtime.capture_hint(908) == runtime.CAPTURE_HINT


def test_first_load_inside_a_capture_is_relaxed(monkeypatch):
    # launch._loading: the module load of a kernel's first use inside a capture runs with the
    # thread's capture mode relaxed; an error there names the fix; outside a capture, no change.
    import torch

    from normir import launch

    lib = FakeCuda()
    d = Driver("cuda", lib=lib)
    with launch._loading(d):
        assert lib.capture_mode == 0  # torch not initialized here: no capture
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with launch._loading(d):
        assert lib.capture_mode == 2
        d.function(0, "k", b"x", "rmsnorm_fwd")
    assert lib.capture_mode == 0
    with pytest.raises(DriverError, match=r"^cuModuleGetFunction \(rmsnorm_bwd\) failed with error 1: unknown error "
                                          r"\(inside a CUDA graph capture: run the call once before capturing"):
        lib.codes["cuModuleGetFunction"] = 1
        with launch._loading(d):
            d.function(0, "k2", b"y", "rmsnorm_bwd")
    assert lib.capture_mode == 0


# ---------------------------------------------------------------------------- HIP through the fake


def test_hip_paths():
    lib = FakeHip()
    d = Driver("hip", lib=lib)
    assert lib.hipGetErrorString.restype is ctypes.c_char_p
    assert d.error_string(719) == "hipErrorLaunchFailure"
    assert d.error_string(4242) == "unknown error"  # NULL from hipGetErrorString
    h = LaunchHandle(d, d.function(2, "k", b"hsaco", "rmsnorm_fwd"), "rmsnorm_fwd", 1024, ("a", "n"), ("p", "q"))
    assert lib.called("hipSetDevice") == [(2,)]
    assert lib.called("hipDeviceGet") == []
    assert h.blocks_per_sm == 3
    h.launch_named(4, 0x55, a=0x1000, n=8)
    assert lib.launches[0]["grid"] == (4, 1, 1) and lib.launches[0]["block"] == (1024, 1, 1)
    assert lib.launches[0]["values"] == [0x1000, 8]
    lib.codes["hipModuleLaunchKernel"] = 719
    with pytest.raises(DriverError, match=r"^hipModuleLaunchKernel \(rmsnorm_fwd, grid 4, block 1024\) failed with "
                                          r"error 719: hipErrorLaunchFailure$"):
        h.launch_named(4, 0, a=0, n=0)


def test_hip_set_device_failure():
    d = Driver("hip", lib=FakeHip(hipSetDevice=1))
    with pytest.raises(DriverError, match=r"^hipSetDevice failed with error 1: hipErrorInvalidValue$"):
        d.function(0, "k", b"x", "rmsnorm_fwd")
