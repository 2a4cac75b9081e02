"""normir's custom ops on DTensors (torch.distributed.tensor): a sharding rule per op, registered
through torch's public register_sharding, so that tensor and sequence parallelism (and anything
else that hands the ops DTensors) runs each op on the local shards.

Rows are normalized independently, so an op runs on any shard of the leading (non-normalized)
dims as it is:

    row tensors (x, residual, dy, residual_out, d_residual_out, y, dx, dresidual)  Shard(d)
    per-row statistics (rstd, mean; shape x.shape[:-1]: the same leading dims)      Shard(d)
    per-column inputs (weight, bias)                                                Replicate
    per-column gradients (dw, db: each shard's rows summed)                         Partial (sum)
    absent outputs (the (0,)-shaped placeholders)                                   Replicate

for every leading dim d, and everything replicated; each mesh dim takes one of these (a 2-D
DP x TP mesh shards two leading dims, or one dim twice). No rule shards the normalized (last)
dim: as for torch's own norms, DTensor then redistributes the input to the cheapest rule
(gathers the row, or moves the shard to a leading dim). Which outputs are absent is read from
the arguments, as the fake implementations decide it.

SequenceParallel (below) is torch's tensor-parallel style for a norm layer, extended to the fused
adds' two inputs.

torch.distributed.tensor costs half a second to import, so normir.ops loads this module only
once the program has imported it (no DTensor exists before): see normir.ops.__init__.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor._op_schema import RuntimeSchemaInfo
from torch.distributed.tensor.experimental import register_sharding
from torch.distributed.tensor.parallel import SequenceParallel as TorchSequenceParallel

from . import fused_add_rmsnorm, layernorm, rmsnorm  # noqa: F401  (the ops are defined)

LEAD, SUM, ABSENT = "lead", "sum", "absent"  # an output: follows the leading dims, a column sum, a placeholder
COLUMNS = ("weight", "bias")  # the per-column inputs; every other tensor argument is a row or a row statistic
STATS = ("rstd", "mean")  # the per-row statistics: x.shape[:-1]


def _two_grads(a: dict) -> bool:
    """A fused backward writes dresidual apart from dx only where its dtype differs (bwd_outputs)."""
    dx_dtype = a["dx_dtype"] or a["residual_out"].tensor_meta.dtype
    return a["dres_dtype"] is not None and a["dres_dtype"] != dx_dtype


# Each op's outputs, from its arguments (a: name -> value, DTensorSpecs for the tensors, None for
# absent ones): what each output is, as the op's fake implementation shapes it.
OUTPUTS: dict[str, Callable[[dict], tuple[str, ...]]] = {
    "rmsnorm_fwd": lambda a: (LEAD, LEAD if a["store_rstd"] else ABSENT),
    "rmsnorm_bwd": lambda a: (LEAD, SUM if a["weight"] is not None else ABSENT),
    "fused_add_rmsnorm_fwd": lambda a: (
        LEAD, LEAD if a["store_residual"] and a["residual"] is not None else ABSENT,
        LEAD if a["store_rstd"] else ABSENT),
    "fused_add_rmsnorm_bwd": lambda a: (
        LEAD, LEAD if _two_grads(a) else ABSENT, SUM if a["weight"] is not None else ABSENT,
        SUM if a["bias_dtype"] is not None else ABSENT),
    "layernorm_fwd": lambda a: (
        LEAD, LEAD if a["store_residual"] and a["residual"] is not None else ABSENT,
        *(LEAD if a["store_stats"] else ABSENT,) * 2),
    "layernorm_bwd": lambda a: (
        LEAD, LEAD if _two_grads(a) else ABSENT, SUM if a["weight"] is not None else ABSENT,
        SUM if a["bias_dtype"] is not None else ABSENT),
}


def _is_tensor(arg: torch.Argument) -> bool:
    t = arg.type
    return isinstance(t, torch.TensorType) or (isinstance(t, torch.OptionalType)
                                                and isinstance(t.getElementType(), torch.TensorType))


def strategies(name: str, names: tuple[str, ...], tensors: tuple[bool, ...], args: tuple) -> list[tuple[list, list]]:
    """The (output placements, input placements) an op `name` accepts on one mesh dim; args are
    its arguments as register_sharding passes them (DTensorSpecs for the tensors). The first
    argument is always a row tensor (x or dy)."""
    a = dict(zip(names, args))
    outputs = OUTPUTS[name](a)

    def rule(lead, col_sum):
        outs = [lead if o == LEAD else col_sum if o == SUM else Replicate() for o in outputs]
        ins = [None if not is_t or a[n] is None else Replicate() if n in COLUMNS else lead
               for n, is_t in zip(names, tensors)]
        return outs, ins

    ndim = args[0].ndim
    # A statistic not of shape x.shape[:-1] (a caller's own flattening) shares no leading dims with x.
    lead_dims = range(ndim - 1) if all(a.get(s) is None or a[s].ndim == ndim - 1 for s in STATS) else range(0)
    return [rule(Replicate(), Replicate())] + [rule(Shard(d), Partial()) for d in lead_dims]


def _register(name: str) -> None:
    op = getattr(torch.ops.normir, name).default
    schema = op._schema.arguments
    names, tensors = tuple(a.name for a in schema), tuple(_is_tensor(a) for a in schema)
    register_sharding(op)(lambda *args: strategies(name, names, tensors, args))
    # register_sharding keys DTensor's cache of sharding decisions on the tensors' specs and on the
    # arguments from the first int one on (ScalarType? counts as one): rmsnorm_fwd has none, so a
    # call with store_rstd=False would reuse the decision (and rstd's global shape) of an earlier
    # store_rstd=True call. Every non-tensor argument decides the outputs' shapes or dtypes here:
    # the key takes them all. (register_sharding takes no schema info of its own in torch 2.11-2.14.)
    first = next(i for i, t in enumerate(tensors) if not t)
    DTensor._op_dispatcher.sharding_propagator.op_to_schema_info[op] = RuntimeSchemaInfo(first, needs_pytree=True)


for _name in OUTPUTS:
    _register(_name)


# ---------------------------------------------------------------------------- sequence parallelism


class SequenceParallel(TorchSequenceParallel):
    """torch's SequenceParallel for normir's norm modules, the fused adds' forward(x, residual)
    too: each tensor input is sharded on the sequence dim as torch's style shards its one input
    (a torch.Tensor is taken as the local shard, a DTensor is redistributed to it), where torch's
    takes the first input alone and drops the residual; with use_local_output, each output (y and
    residual_out) is made local. The parameters are replicated as torch's style does (from each
    rank's own values: initialize them alike)."""

    @staticmethod
    def _prepare_input_fn(sequence_sharding, mod, inputs, device_mesh):
        shard = TorchSequenceParallel._prepare_input_fn
        return tuple(t if t is None else shard(sequence_sharding, mod, (t,), device_mesh) for t in inputs)

    @staticmethod
    def _prepare_output_fn(use_local_output, mod, outputs, device_mesh):
        if not use_local_output:
            return outputs
        return tuple(o.to_local() for o in outputs) if isinstance(outputs, tuple) else outputs.to_local()
