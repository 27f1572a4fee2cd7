"""Count and time every collective a step issues, whoever issues it (FSDP2, ZeRO, DTensor).

Engines such as FSDP2 or DTensor call their collectives deep inside PyTorch, so no hook of
ours sits around them. They all go through PyTorch's dispatcher, though, as ``c10d.*`` ops
(``dist.all_reduce``, FSDP2's all-gather and reduce-scatter, ZeRO's broadcasts) or as
functional ``_c10d_functional.*`` ops (DTensor's redistributions). A ``TorchDispatchMode``
sees each one go by and records, into the step's ``CommMeter``: its kind, the bytes of the
full tensor it works on, and when it was issued and when it completed (a callback on the
work's future, so an asynchronous collective keeps running in the background exactly as it
would without us; the few works that have no future, such as gloo's reduce-scatter, are
waited for at once). A functional collective is waited for at once: the op after it needs its
result anyway (a row-wise layer's output), so this only moves the wait a few ops earlier.
"""

from __future__ import annotations

import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from labkit.comm.meter import CommMeter

# op name (without overload) -> (kind, which argument holds the full tensor(s))
_C10D = {"allreduce_": ("all_reduce", 0), "allreduce_coalesced_": ("all_reduce", 0),
         "broadcast_": ("broadcast", 0), "allgather_": ("all_gather", 0),
         "_allgather_base_": ("all_gather", 0), "allgather_into_tensor_coalesced_":
         ("all_gather", 0), "reduce_scatter_": ("reduce_scatter", 1),
         "_reduce_scatter_base_": ("reduce_scatter", 1), "reduce_scatter_tensor_coalesced_":
         ("reduce_scatter", 1), "alltoall_": ("all_to_all", 1), "alltoall_base_":
         ("all_to_all", 1), "reduce_": ("reduce", 0), "gather_": ("gather", 1),
         "scatter_": ("scatter", 0)}
_FUNCTIONAL = {"all_reduce": "all_reduce", "all_reduce_coalesced": "all_reduce",
               "all_gather_into_tensor": "all_gather", "all_gather_into_tensor_coalesced":
               "all_gather", "reduce_scatter_tensor": "reduce_scatter",
               "reduce_scatter_tensor_coalesced": "reduce_scatter",
               "all_to_all_single": "all_to_all", "broadcast": "broadcast"}


def _nbytes(value) -> int:
    if isinstance(value, torch.Tensor):
        return value.nbytes
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    return 0


class CollectiveMeter(TorchDispatchMode):
    """Record every collective issued inside ``with CollectiveMeter(meter):``.

    Bytes are those of the full tensor each collective works on (the AllReduced gradient,
    the gathered parameter, the reduce-scattered gradient): the same measure for every
    strategy; a ring moves about 2(N-1)/N of it per rank for AllReduce, (N-1)/N for the others.
    """

    def __init__(self, meter: CommMeter):
        super().__init__()
        self.meter = meter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func._schema.name.split("::")[-1]
        namespace = func.namespace
        if namespace == "c10d" and name in _C10D:
            return self._c10d(func, name, args, kwargs)
        if namespace == "_c10d_functional" and name in _FUNCTIONAL:
            start = time.perf_counter()
            out = func(*args, **kwargs)
            for tensor in out if isinstance(out, (list, tuple)) else [out]:
                torch.ops._c10d_functional.wait_tensor(tensor)
            self.meter.record(_nbytes(args[0]), start, time.perf_counter(), _FUNCTIONAL[name])
            return out
        return func(*args, **kwargs)

    def _c10d(self, func, name, args, kwargs):
        from torch._C._distributed_c10d import Work

        kind, arg = _C10D[name]
        nbytes = _nbytes(args[arg])
        start = time.perf_counter()
        out = func(*args, **kwargs)
        meter = self.meter

        def done(future):
            meter.record(nbytes, start, time.perf_counter(), kind)

        work = Work.unbox(out[1])
        try:
            work.get_future().then(done)
        except RuntimeError:  # a work without a future (gloo's reduce-scatter): wait here
            work.wait()
            done(None)
        return out
