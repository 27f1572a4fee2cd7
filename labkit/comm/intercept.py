"""Count and time the collectives a step issues, whoever issues them: DDP's bucket hook,
ZeRO's broadcasts, FSDP2's all-gathers and reduce-scatters, DTensor's redistributions,
labkit's own named operations.

They all call ``torch.distributed``'s Python functions (``dist.all_reduce``,
``dist.all_gather_single``, ...) or its functional collectives (``funcol.all_reduce``, what
DTensor uses). While a ``CollectiveMeter`` is entered, those functions are replaced by thin
wrappers that record, into the step's ``CommMeter``: the kind of collective, the bytes of the
full tensor it works on (and what a ring sends per rank for it), and when it was issued and
when it completed. An asynchronous collective keeps running in the background as it would
without us (its end is taken from a callback on its future; the few works without a future,
such as gloo's reduce-scatter, are waited for at once). A functional collective is waited for
at once: the op after it needs its result anyway. Only collectives pay for this; the other ops
of the step run untouched. (A ``TorchDispatchMode`` would see them too, but it puts Python in
front of every op of the step: on small models that doubled the step time.)

Not counted: point-to-point sends (pipelines time their waiting instead), and collectives
that code imported by name before the meter was entered (DTensor's ``mesh_broadcast``, used
when a tensor is first distributed, not in training steps).

Times are host times: exact for CPU ranks (gloo completes on the host). On CUDA, NCCL
completes a work's future when its kernels are queued, so there the intervals are launch
times; the bytes and calls are exact everywhere.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
import time

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.distributed.distributed_c10d as c10d

from labkit.comm.meter import CommMeter

# torch.distributed function -> (kind, the argument that holds the full tensor(s))
_DIST = {"all_reduce": ("all_reduce", "tensor"), "broadcast": ("broadcast", "tensor"),
         "reduce": ("reduce", "tensor"), "all_gather": ("all_gather", "tensor_list"),
         "all_gather_single": ("all_gather", "output_tensor"),
         "all_gather_into_tensor": ("all_gather", "output_tensor"),
         "reduce_scatter": ("reduce_scatter", "input_list"),
         "reduce_scatter_single": ("reduce_scatter", "input"),
         "reduce_scatter_tensor": ("reduce_scatter", "input"),
         "all_to_all_single": ("all_to_all", "input"),
         "all_to_all": ("all_to_all", "input_tensor_list")}
# functional collective -> kind (bytes: the input, or the output of a gather)
_FUNCOL = {"all_reduce": "all_reduce", "broadcast": "broadcast",
           "all_gather_single": "all_gather", "all_gather_tensor": "all_gather",
           "all_gather_tensor_autograd": "all_gather", "reduce_scatter_single": "reduce_scatter",
           "reduce_scatter_tensor": "reduce_scatter",
           "reduce_scatter_tensor_autograd": "reduce_scatter",
           "all_to_all_single": "all_to_all", "all_to_all_single_autograd": "all_to_all"}

_active: list[CommMeter] = []  # meters entered, innermost last
_originals: dict[tuple[object, str], object] = {}
_local = threading.local()  # depth: a collective that calls another is counted once
_lock = threading.Lock()


def _nbytes(value) -> int:
    if isinstance(value, torch.Tensor):
        return value.nbytes
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    return 0


@contextlib.contextmanager
def _outermost():
    """The meter to record into, or None (no meter, or inside another wrapped collective)."""
    depth = getattr(_local, "depth", 0)
    _local.depth = depth + 1
    try:
        active = list(_active)  # a snapshot: another thread may exit a meter meanwhile
        yield active[-1] if depth == 0 and active else None
    finally:
        _local.depth = depth


def _group_size(group) -> int:
    try:
        if isinstance(group, (dist.ProcessGroup, type(None))):
            return dist.get_world_size(group)
        return funcol._expand_group(group)[2]  # a mesh, (mesh, dim), ranks or a name
    except Exception:  # noqa: BLE001 - the size only scales the wire bytes
        return dist.get_world_size()


def _wrap(original, kind: str, complete):
    """``original`` with its call recorded: ``complete(out, bound_arguments, done)`` says how
    the collective ends and calls ``done(nbytes)`` when it has."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def collective(*args, **kwargs):
        with _outermost() as meter:
            if meter is None:
                return original(*args, **kwargs)
            bound = signature.bind(*args, **kwargs).arguments
            size, start = _group_size(bound.get("group")), time.perf_counter()
            out = original(*args, **kwargs)

            def done(nbytes: int) -> None:
                meter.record(nbytes, start, time.perf_counter(), kind, size)

            complete(out, bound, done)
            return out

    return collective


def _wrap_dist(name: str, original):
    kind, argument = _DIST[name]

    def complete(work, bound, done):
        nbytes = _nbytes(bound.get(argument))
        if work is None:  # blocking call: it is done
            done(nbytes)
            return
        try:
            work.get_future().then(lambda _future: done(nbytes))
        except RuntimeError:  # a work without a future: wait for it here
            work.wait()
            done(nbytes)

    return _wrap(original, kind, complete)


def _wrap_funcol(name: str, original):
    kind = _FUNCOL[name]

    def complete(out, bound, done):
        if isinstance(out, funcol.AsyncCollectiveTensor):
            out.trigger_wait()
        else:
            torch.ops._c10d_functional.wait_tensor(out)
        done(_nbytes(out) if kind == "all_gather" else _nbytes(bound["self"]))

    return _wrap(original, kind, complete)


def _install() -> None:
    """Replace every collective function by its wrapper, all or none."""
    plan = [(module, name, _wrap_dist) for module in (dist, c10d) for name in _DIST]
    plan += [(funcol, name, _wrap_funcol) for name in _FUNCOL]
    try:
        for module, name, wrap in plan:
            original = getattr(module, name)
            _originals[module, name] = original
            setattr(module, name, wrap(name, original))
    except Exception:
        _uninstall()
        raise


def _uninstall() -> None:
    for (module, name), original in _originals.items():
        setattr(module, name, original)
    _originals.clear()


class CollectiveMeter:
    """Record every collective issued inside ``with CollectiveMeter(meter):`` into
    ``meter`` (a ``CommMeter``); meters may nest (the innermost records). The functions are
    restored when the last meter exits, whatever happened inside.

    Bytes are those of the full tensor each collective works on (the AllReduced gradient,
    the gathered parameter, the reduce-scattered gradient); ``wire_bytes`` what a ring sends
    per rank for it: 2(N-1)/N of it for AllReduce, (N-1)/N for the others.
    """

    def __init__(self, meter: CommMeter):
        self.meter = meter

    def __enter__(self) -> CommMeter:
        with _lock:
            if not _active:
                _install()
            _active.append(self.meter)
        return self.meter

    def __exit__(self, *exc) -> None:
        with _lock:
            try:
                index = max(i for i, m in enumerate(_active) if m is self.meter)
                del _active[index]
            finally:
                if not _active:
                    _uninstall()
