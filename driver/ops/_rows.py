"""What every row op shares: argument checks, row views, the device guard, output allocation,
kernel plans and launches (a block per row group, or a persistent grid with column sums), the
fast path of repeated eager calls, and the switch between eager launches and custom ops.

An op module (rmsnorm.py) holds only its API, its math's references and its modules; it calls
these. Checks raise TypeError/ValueError naming the argument and the fix, and run on real and on
fake tensors alike (the custom ops' fake implementations call them too).
"""

from __future__ import annotations

import functools
import math
import operator
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import torch
from torch.autograd.function import _SingleLevelFunction

from .. import launch as L
from ..layout import MAX_VECTOR_BYTES, Layout
from ..options import FLT_MIN, MAX_N, Problem
from ..runtime import LaunchHandle

# ---------------------------------------------------------------------------- checks


def check_eps(eps: float, values: bool = True) -> float:
    """eps as a float, checked. values=False: its type only. A wrapper that calls a custom op
    passes False: under torch.compile eps may be a float Dynamo traces, on which a value check
    (math.isfinite) cannot run; the op's fake implementation runs the whole check at trace time,
    on the value the graph is specialized for, with the same message."""
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise TypeError(f"eps must be a float, got {type(eps).__name__}")
    if not values:
        return eps
    eps = float(eps)
    if not (math.isfinite(eps) and eps >= FLT_MIN):
        raise ValueError(f"eps={eps!r} must be a finite float >= {FLT_MIN:g} (a normal float32), e.g. 1e-6")
    return eps


def on_gpu(t: torch.Tensor) -> bool:
    """Where the kernels can run: a CUDA (or ROCm) tensor. (The CPU tier's autograd and torch.func
    tests replace the launches with CPU math and this test with True.)"""
    return t.is_cuda


def dtensor(t: object) -> bool:
    """t is a DTensor. torch.distributed.tensor is not imported for it: before the program has
    imported it, no DTensor exists."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(t, module.DTensor)


def off_gpu(t: torch.Tensor, name: str) -> str:
    """Why the kernels cannot read t, which is not on a GPU, and the fix."""
    if dtensor(t):
        return (f"{name} is a DTensor on a {t.device_mesh.device_type} device mesh; normir runs on GPUs: make the mesh "
                f"on them (init_device_mesh(\"cuda\", ...)) and distribute {name} there")
    if t.is_meta:
        return (f"{name} is on the meta device (a shape without data); normir runs on GPUs: materialize it there first "
                "(module.to_empty(device=\"cuda\"), then initialize the parameters)")
    return f"{name} is on {t.device}; normir runs on GPUs: move it with {name}.cuda()"


def check_input(x: torch.Tensor, name: str, device: bool = True) -> str:
    """A row tensor: on a GPU, a supported dtype, 1 <= N <= MAX_N. Returns its dtype's name.

    device=False leaves out the GPU test: the custom ops' fake implementations pass it, as they run
    on fake tensors whose device may not be the caller's. DTensor's sharding propagation makes
    its own without a device in torch 2.11 (CPU ones) for the global shapes; the device is checked
    where it is known, on the real tensors of a launch and on what a public function is given (a
    DTensor's device is its mesh's)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if device and not on_gpu(x):
        raise ValueError(off_gpu(x, name))
    dt = L.dtype_name(x.dtype, name)
    if x.dim() < 1:
        raise ValueError(f"{name} must have at least one dimension (the normalized one), got a scalar")
    # int(): a size torch.compile traces symbolically is specialized here (the fake
    # implementations run these checks): N is a compile-time constant of every kernel, so a graph
    # is made per N, and only the leading (batch) sizes stay dynamic.
    n = int(x.shape[-1])
    if not 1 <= n <= MAX_N:
        raise ValueError(f"{name}.shape[-1] = {n} is out of range: normir supports 1 <= N <= {MAX_N}")
    return dt


def check_same_kind(t: torch.Tensor, x: torch.Tensor, name: str, x_name: str = "x") -> None:
    """t and x are both DTensors or neither: an op on DTensors runs on their local shards, which a
    plain tensor beside them is not (DTensor refuses the mix with a message that names no argument;
    the eager launch would read a DTensor's wrapper, which has no data)."""
    if dtensor(t) == dtensor(x):
        return
    if dtensor(x):
        raise ValueError(f"{name} is a torch.Tensor but {x_name} is a DTensor: pass both as DTensors on one mesh (a "
                         f"module's parameters: parallelize it, e.g. with normir.ops.distributed.SequenceParallel; a "
                         f"tensor: distribute_tensor or DTensor.from_local), or both as local tensors "
                         f"({x_name}.to_local())")
    raise ValueError(f"{name} is a DTensor but {x_name} is a torch.Tensor: pass both as DTensors on one mesh "
                     f"(SequenceParallel makes a norm's input one: DTensor.from_local({x_name}, mesh, placements)), "
                     f"or both as local tensors ({name}.to_local())")


def check_grad(t: torch.Tensor, x: torch.Tensor, name: str, x_name: str = "x", device: bool = True) -> None:
    """An incoming gradient (dy, d_residual_out): a row tensor of x's (named x_name) shape and
    device, in any of the three float dtypes whatever x's (the kernels read it in its own type)."""
    check_input(t, name, device)
    check_same_kind(t, x, name, x_name)
    if t.shape != x.shape or t.device != x.device:
        raise ValueError(f"{name} must match {x_name} in shape and device: {name} is {tuple(t.shape)} on "
                         f"{t.device}, {x_name} is {tuple(x.shape)} on {x.device}")


def check_weight(weight: torch.Tensor | None, x: torch.Tensor, n: int, name: str = "weight") -> torch.Tensor | None:
    """A per-column tensor: None, or (N,) on x's device in float32, float16 or bfloat16, whatever
    x's dtype (each read in its own type). A strided one is copied (N elements)."""
    if weight is None:
        return None
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None, got {type(weight).__name__}")
    check_same_kind(weight, x, name)
    if weight.get_device() != x.get_device():
        raise ValueError(f"{name} is on {weight.device} but x is on {x.device}; put both on one device")
    L.dtype_name(weight.dtype, name)
    if weight.dim() != 1 or weight.shape[0] != n:
        raise ValueError(f"{name} has shape {tuple(weight.shape)}; it must be ({n},), the size of x's last dim")
    return weight if weight.is_contiguous() else weight.contiguous()


def check_stat(stat: torch.Tensor, x: torch.Tensor, name: str, made_by: str, x_name: str = "x") -> None:
    """A per-row fp32 statistic the forward stored (rstd): x.shape[:-1] elements on x's device
    (x named x_name)."""
    if isinstance(stat, torch.Tensor):
        check_same_kind(stat, x, name, x_name)
    if not isinstance(stat, torch.Tensor) or stat.dtype != torch.float32 or stat.device != x.device \
            or stat.numel() != x.numel() // max(x.shape[-1], 1):
        raise ValueError(f"{name} must be the float32 tensor of shape {x_name}.shape[:-1] on {x_name}'s device "
                         f"that {made_by} returned")


# ---------------------------------------------------------------------------- rows


def rows_of(t: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(M, N) view of t and its row stride in elements. Rows may be strided (any row pitch);
    a last dimension that is not contiguous, or leading dims that cannot be flattened into
    one strided dimension, are copied first. A contiguous t is returned as it is (the kernels
    only use its pointer, the row count and the stride)."""
    n = t.shape[-1]
    if t.is_contiguous():
        return t, n
    if t.stride(-1) != 1 and n > 1:
        t = t.contiguous()
    try:
        t2 = t.view(-1, n)
    except RuntimeError:
        t2 = t.reshape(-1, n).contiguous()
    stride = t2.stride(0) if t2.shape[0] > 1 else n
    return t2, stride


def vector_width(n: int, tensors: tuple[torch.Tensor | None, ...], strides: tuple[int, ...], rows: int = 0) -> int:
    """The widest vector (elements) that N, the row strides and every tensor's alignment allow:
    16 bytes of the narrowest of the first `rows` tensors (the row tensors; 0: the first alone),
    where all of them are 16-byte aligned."""
    row_tensors = [t for t in tensors[:rows or 1] if t is not None]
    eb = min(t.element_size() for t in row_tensors)
    widest = MAX_VECTOR_BYTES // eb
    ptrs = [(t.data_ptr(), t.element_size()) for t in tensors if t is not None]
    if n % widest == 0 and all(s % widest == 0 for s in strides) and all(p % MAX_VECTOR_BYTES == 0 for p, _ in ptrs):
        return widest  # the common case, without the general search
    return L.vector_width(n, eb, tuple(ptrs), strides)


# The fast paths take a weight that is a plain tensor or a module's Parameter (a subclass that
# changes nothing here); any other subclass goes through the checks.
PLAIN = (torch.Tensor, torch.nn.Parameter)

current_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device
raw_stream = L.stream if L._raw_stream is None else L._raw_stream  # skips a Python call where torch has it


@cache
def sm_count(device: int) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


class on_device:
    """Launch under the tensor's device so that its context and stream are the ones used."""

    __slots__ = ("dev", "prev")

    def __init__(self, dev: int):
        self.dev = dev

    def __enter__(self):
        self.prev = current_device()
        if self.prev != self.dev:
            torch.cuda.set_device(self.dev)

    def __exit__(self, *exc):
        if self.prev != self.dev:
            torch.cuda.set_device(self.prev)


# torch.empty(shape, dtype=..., device=...) parses its keyword arguments against every overload:
# about 6 us of host time per call on the H200 machine, against 3 us for torch.empty_like(t)
# without them. A float32 output of a shape seen before (rstd, mean, the partial column sums)
# is therefore made like a cached prototype: one float32 element expanded to the shape (its
# stride-0 layout is not dense, so empty_like gives the contiguous layout).
_F32_PROTOS: dict[tuple, torch.Tensor] = {}


def empty_f32(shape: tuple[int, ...], dev: int, per_row: bool = False) -> torch.Tensor:
    """A new contiguous float32 tensor of `shape` on GPU `dev` (uninitialized); per_row: of
    shape[:-1] (a per-row statistic of rows shaped `shape`: the key is x.shape itself, which
    saves slicing it, 0.4 us, on every call)."""
    key = (shape, dev, per_row)
    proto = _F32_PROTOS.get(key)
    if proto is None:
        if len(_F32_PROTOS) >= 256:  # many distinct shapes: start over rather than grow
            _F32_PROTOS.clear()
        # 0-dim, so that it expands to any shape, () too (a 1-D x's per-row statistic, under vmap)
        one = torch.empty((), dtype=torch.float32, device=torch.device("cuda", dev))
        proto = _F32_PROTOS[key] = one.expand(shape[:-1] if per_row else shape)
    return torch.empty_like(proto)


def launch(dev: int, handle: LaunchHandle, grid: int, *args: int) -> None:
    """handle.launch on GPU dev's current stream (positional arguments, in the kernel's order),
    from dev's context: the thread's device is switched for the launch only where it is another
    (the usual call switches nothing, and takes no context manager's calls)."""
    if current_device() == dev:
        handle.launch(grid, raw_stream(dev), *args)
        return
    with on_device(dev):
        handle.launch(grid, raw_stream(dev), *args)


def stat_out(x: torch.Tensor, stored: bool) -> torch.Tensor:
    """A per-row fp32 output (x.shape[:-1]), or an empty one when the op does not store it."""
    return torch.empty(x.shape[:-1] if stored else (0,), dtype=torch.float32, device=x.device)


# ---------------------------------------------------------------------------- kernels and grids


@dataclass(frozen=True)
class Plan:
    """A loaded kernel, its layout, and how many blocks a launch over m rows takes. A launch takes
    the values of its template's arguments by name and packs the kernel's own (KernelSpec.args, the
    one place their order is written; a template argument the kernel does not take is ignored)."""

    handle: LaunchHandle
    layout: Layout
    persistent: bool
    resident: int  # clusters (or blocks) that run at once: a persistent grid's cap
    pick: Callable[[dict], tuple]  # the kernel's arguments (but grid), in its order, from a dict of values

    def grid(self, m: int) -> int:
        groups = -(-m // self.layout.rows)
        return (min(groups, self.resident) if self.persistent else groups) * self.layout.cluster

    def clusters(self, m: int) -> int:
        """Clusters (or blocks) of a persistent launch over m rows: its partial rows per slot."""
        return self.grid(m) // self.layout.cluster

    def launch(self, dev: int, grid: int, **values: int) -> None:
        """The kernel over `grid` blocks on GPU dev's current stream; values: its template's
        arguments by name (pointers and integers)."""
        launch(dev, self.handle, grid, *self.pick(values))


def picker(kernel: str) -> Callable[[dict], tuple]:
    """The function that takes a kernel's arguments (but grid, which the launch fills) from a dict
    of named values, in the kernel's order."""
    names = [a.name for a in L.KERNELS[kernel].args if a.name != "grid"]
    get = operator.itemgetter(*names)
    return get if len(names) > 1 else (lambda values: (get(values),))


@cache
def _has_pdl(dev: int) -> bool:
    return L.targets.get(L.device_target(dev)).grid_dep_piece is not None


def use_pdl(dev: int, enable: bool | None) -> bool:
    """Whether a serving forward on GPU dev launches with programmatic dependent launch: where its
    target has it, as enable says (None: NORMIR_PDL's setting)."""
    if enable is None:
        enable = L.env.PDL.get() != "0"
    return bool(enable) and _has_pdl(dev)


_plans: dict[tuple, Plan] = L.derived_cache({})


def plan(dev: int, **fields) -> Plan:
    """The kernel for a problem (options.Problem's fields; the target is the device's), loaded on
    GPU dev, with its layout and grid (cached)."""
    key = (dev, *fields.items())
    p = _plans.get(key)
    if p is None:
        kernel = fields["kernel"]
        h, lay = L.handle(Problem(target=L.device_target(dev), **fields), dev)
        persistent = L.KERNELS[kernel].grid == "persistent"
        p = _plans[key] = Plan(h, lay, persistent, h.resident(sm_count(dev)) if persistent else 0, picker(kernel))
    return p


@dataclass(frozen=True)
class ColumnSums:
    """The fixed-order column sums out[j] = sum_p part[p, j] (bit-identical from run to run), cast
    to out's dtype, and with a second output (db) the next parts rows' sums into it, in the same
    launch: a loaded kernel and its grid, for one N and output dtype(s)."""

    plan: Plan
    grid: int

    def launch(self, dev: int, part: int, out: int, parts: int, db: int = 0) -> None:
        """part: the (parts, N) fp32 partial rows' pointer, or (2, parts, N) with db; out: the (N,)
        output's; db: the second (N,) output's (0: none)."""
        self.plan.launch(dev, self.grid, part=part, out=out, db=db, parts=parts)


_sums: dict[tuple, ColumnSums] = L.derived_cache({})


def column_sums(dev: int, n: int, out_dtype: torch.dtype, db_dtype: torch.dtype | None = None) -> ColumnSums:
    """The column sums' kernel for one output of out_dtype, or two (dw, then db of db_dtype)."""
    key = (dev, n, out_dtype, db_dtype)
    c = _sums.get(key)
    if c is None:
        p = plan(dev, kernel="rmsnorm_dw_reduce", n=n, dtype="f32", wdtype=L.TORCH_DTYPES[out_dtype], eps=BWD_KEY_EPS,
                 vec=L.vector_width(n, 4, (), ()), bdtype=L.TORCH_DTYPES[db_dtype] if db_dtype is not None else "")
        c = _sums[key] = ColumnSums(p, -(-p.layout.nchunk // p.layout.tpr) * (2 if db_dtype is not None else 1))
    return c


BWD_KEY_EPS = 1e-6  # kernels that do not use eps take one value: one binary per shape


# ---------------------------------------------------------------------------- eager or traced


_functorch_active = torch._C._are_functorch_transforms_active


def eager(x: object) -> bool:
    """Launch directly (a plain tensor, not under torch.compile nor a torch.func transform), or
    go through the custom op (tracing, fake or functional tensors, torch.func's wrappers). The
    custom op's dispatch costs tens of microseconds."""
    return type(x) is torch.Tensor and not torch.compiler.is_compiling() and not _functorch_active()


# ---------------------------------------------------------------------------- eager autograd


def c_apply(fn: type[torch.autograd.Function]) -> Callable:
    """fn.apply without torch.autograd.Function.apply's Python layer, which routes functorch
    transforms (never active on the eager path: see eager) and unwraps the wrappers they leave
    behind: 2-5 us of host time per call on the H200 machine (the apply of an identity Function:
    11-13 us, 6-9 us without it)."""
    return super(_SingleLevelFunction, fn).apply


# ---------------------------------------------------------------------------- custom ops

# normir's operators, defined through one torch.library.Library: the dispatcher calls each
# implementation directly. torch.library.custom_op wraps it in Python layers of its own (an
# aliasing check per call, its autograd wrapper) that cost 6-9 us per call on the host, which a
# compiled model pays per norm per step (measured on the CPU machine: 14.0 us per call against
# 7.7 us through Library, 4.6 us for the body alone).
LIB = torch.library.Library("normir", "DEF")


class Op:
    """One operator of LIB, declared from its implementation's annotations (as custom_op does,
    mutating nothing); register_fake and register_autograd as on custom_op's result, and a vmap
    rule. Calling it calls the operator, or under a torch.func transform its Function (see
    register_autograd)."""

    def __init__(self, name: str, fn: Callable, mutates: tuple[str, ...] = ()):
        self.name = name
        self.qualname = f"normir::{name}"
        # mutates: the arguments the op writes (the serving forms), annotated Tensor(a!) in the schema
        LIB.define(name + torch.library.infer_schema(fn, mutates_args=mutates))
        LIB.impl(name, fn, "CompositeExplicitAutograd")  # every device: the checks name the fix
        self.overload = getattr(torch.ops.normir, name).default
        self.args = tuple(a.name for a in self.overload._schema.arguments)
        self.func: type[torch.autograd.Function] | None = None
        self.rows: tuple[int, ...] = ()
        self.batched_outputs: Callable | None = None
        if not mutates:  # (no vmap of the in-place serving forms)
            torch.library.register_vmap(self.qualname, self._vmap, lib=LIB)

    def __call__(self, *args):
        if self.func is not None and not torch.compiler.is_compiling() and _functorch_active():
            return self.func.apply(*args)
        return self.overload(*args)

    def register_fake(self, fn: Callable) -> Callable:
        torch.library.register_fake(self.qualname, fn, lib=LIB)
        return fn

    def register_autograd(self, backward: Callable, *, setup_context: Callable) -> None:
        """The op's autograd for the dispatcher (what torch.compile traces), and the same
        formulas as an autograd.Function for torch.func's transforms, which do not run an
        operator's registered autograd: its forward is the operator, vmapped by the op's vmap
        rule (generate_vmap_rule), so that grad, vjp, jacrev and vmap of grad compose."""
        torch.library.register_autograd(self.qualname, backward, setup_context=setup_context, lib=LIB)
        op, name = self.overload, self.qualname

        def jvp(ctx, *_):
            raise NotImplementedError(
                f"{name} has no forward-mode derivative (torch.func.jvp, jacfwd, torch.autograd.forward_ad): "
                "use reverse mode (torch.func.vjp, grad, jacrev), or torch's own norm for this layer")

        self.func = type(f"{self.name}_func", (torch.autograd.Function,), {
            "forward": staticmethod(lambda *args: op(*args)), "setup_context": staticmethod(setup_context),
            "backward": staticmethod(backward), "jvp": staticmethod(jvp), "generate_vmap_rule": True})

    def vmap_rows(self, rows: tuple[str, ...], batched_outputs: Callable) -> None:
        """Let vmap take the op in one call when only its row tensors (the arguments named by
        rows) are batched, the per-column ones (weight, bias) not: rows are independent, so the
        vmapped dim is one more leading dim. batched_outputs(args) says which outputs then carry
        it (the others are the (0,) placeholders of outputs not asked for). Without it (the
        backwards: every sample's dw is its own) vmap runs the op once per sample."""
        self.rows = tuple(self.args.index(r) for r in rows)
        self.batched_outputs = batched_outputs

    def _vmap(self, info, in_dims, *args):
        b = info.batch_size
        if self.batched_outputs is not None and all(d is None or i in self.rows for i, d in enumerate(in_dims)):
            i, d = next((i, d) for i, d in enumerate(in_dims) if d is not None)
            shape = args[i].shape[:d] + args[i].shape[d + 1:]
            moved = list(args)
            for i in self.rows:
                if args[i] is not None:
                    moved[i] = args[i].movedim(in_dims[i], 0) if in_dims[i] is not None else args[i].expand(b, *shape)
            return self.overload(*moved), tuple(0 if on else None for on in self.batched_outputs(*args))
        if b == 0:
            raise ValueError(f"{self.qualname} under torch.func.vmap: the vmapped dimension has size 0 (no samples)")
        per = [self.overload(*(a.select(d, i) if d is not None else a for a, d in zip(args, in_dims)))
               for i in range(b)]
        return tuple(torch.stack(o) for o in zip(*per)), (0,) * len(per[0])


def custom_op(name: str, mutates: tuple[str, ...] = ()) -> Callable[[Callable], Op]:
    """Decorator: the function as operator normir::name (see Op), writing the arguments named by
    mutates."""
    return lambda fn: Op(name, fn, mutates)


# ---------------------------------------------------------------------------- autocast

# torch.autocast("cuda") gives a norm's output the dtype torch's own op gets there. aten::layer_norm
# (and native_layer_norm) is on autocast's fp32 list in every torch normir supports: its
# floating-point CUDA inputs are cast to float32 first, so y is float32 whatever x and the weight
# are. aten::rms_norm joined that list in torch 2.12; before, autocast leaves it alone and it
# returns x's dtype (torch 2.11: fp32 math, cast back to the input's type). Which list an op is on
# is compiled into torch (ATen/autocast_mode.h, AT_FORALL_FP32), so it is read from the
# dispatcher: an op with an AutocastCUDA kernel is a cast one, and for these norms the cast is
# the fp32 one (tests/test_integration_cpu.py checks that against torch itself, on fake tensors).


def _autocast_casts(op: str) -> bool:
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(op, "AutocastCUDA")
    except RuntimeError:  # an op this torch does not have
        return False


AUTOCAST_FP32 = {"rmsnorm": _autocast_casts("aten::rms_norm"), "layernorm": _autocast_casts("aten::layer_norm")}


def autocast_out_dtype(norm: str, x: object) -> torch.dtype | None:
    """Under torch.autocast("cuda") (the caller has checked torch.is_autocast_enabled()): the
    out_dtype that gives y the dtype torch's own norm gives there (norm: "rmsnorm" or
    "layernorm"), or None where that is normir's default (x's dtype). normir does not cast:
    its kernels read each input in its own type, which is exactly what the fp32 casts would give,
    and write y in float32; the gradients come back in each input's dtype, as through the casts."""
    if not AUTOCAST_FP32[norm] or not isinstance(x, torch.Tensor) or not x.is_cuda or x.dtype == torch.float32:
        return None
    return torch.float32


# ---------------------------------------------------------------------------- double backward

TORCH_RMS = "torch.nn.functional.rms_norm (torch.nn.RMSNorm)"
TORCH_LN = "torch.nn.functional.layer_norm (torch.nn.LayerNorm)"

DOUBLE_BACKWARD = (
    "{name} has no double backward: normir's kernels compute first derivatives only, so the gradient it "
    "returned under create_graph=True cannot be differentiated again. For a second derivative through this "
    "layer (a gradient penalty, a Hessian-vector product, MAML) use torch's own {torch_op} for it, or keep "
    "this layer out of the part of the graph that is differentiated twice")


class _NoDoubleBackward(torch.autograd.Function):
    """The identity on the first `count` tensors (the gradients a backward returned), made a
    node of the graph that create_graph=True builds, with the other tensors (every tensor those
    gradients depend on) as inputs; its own backward (the second derivative) raises its message.
    In setup_context form with a generated vmap rule, so that torch.func's transforms (which
    always build that graph) take it too."""

    generate_vmap_rule = True

    @staticmethod
    def forward(message, count, *tensors):
        return tensors[:count]  # tensors made by the kernels: they get this node as grad_fn

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.message = inputs[0]

    @staticmethod
    def backward(ctx, *_):
        raise RuntimeError(ctx.message)


def first_order_only(name: str | Callable[[object], str], torch_op: str | Callable[[object], str]):
    """Decorate an autograd backward (an autograd.Function's, or a custom op's registered one)
    whose kernels have no derivative of their own.

    With create_graph=False (the usual backward) grad mode is off inside a backward and this adds
    nothing. With create_graph=True it is on: the kernels run under no_grad and their outputs go
    through _NoDoubleBackward, connected to the saved tensors and the incoming gradients (what a
    true second derivative depends on). A second backward that reaches them raises a RuntimeError
    naming the op and the fix; one that does not (create_graph=True for another layer's sake) runs
    as usual. torch's once_differentiable is not enough: it attaches its error only where an
    incoming gradient requires grad, so loss = y.sum(); g = grad(loss, x, create_graph=True);
    g.pow(2).sum().backward() would silently drop this layer's second-order terms (AOTAutograd's
    CompiledFunctionBackward connects the saved tensors for the same reason). name and torch_op
    (torch's op to use instead): strings, or functions of ctx giving them."""

    def wrap(backward):
        @functools.wraps(backward)
        def run(ctx, *grad_outputs):
            if not torch.is_grad_enabled():
                return backward(ctx, *grad_outputs)
            with torch.no_grad():
                grads = backward(ctx, *grad_outputs)
            message = DOUBLE_BACKWARD.format(name=name(ctx) if callable(name) else name,
                                             torch_op=torch_op(ctx) if callable(torch_op) else torch_op)
            return _guard(message, grads, (*ctx.saved_tensors, *grad_outputs))

        return run

    return wrap


def _guard(message: str, grads, depends_on: tuple) -> object:
    deps = [t for t in depends_on if isinstance(t, torch.Tensor) and t.requires_grad]
    seq = grads if isinstance(grads, tuple) else (grads,)
    unique = {id(g): g for g in seq if isinstance(g, torch.Tensor)}  # dx may be both dx and dresidual
    if not deps or not unique:
        return grads  # nothing to differentiate: no second derivative exists
    guarded = dict(zip(unique, _NoDoubleBackward.apply(message, len(unique), *unique.values(), *deps)))
    out = tuple(guarded.get(id(g), g) if isinstance(g, torch.Tensor) else g for g in seq)
    return out if isinstance(grads, tuple) else out[0]
