"""Count and time the communication a step issues, whoever issues it: DDP's bucket hook,
ZeRO's broadcasts, FSDP2's all-gathers and reduce-scatters, DTensor's redistributions, a
pipeline's sends and receives, labkit's own named operations.

They all call ``torch.distributed``'s Python functions (``dist.all_reduce``,
``dist.batch_isend_irecv``, ...) or its functional collectives (``funcol.all_reduce``, what
DTensor uses). While a ``CollectiveMeter`` is entered, those functions are replaced by thin
wrappers that record into the step's ``CommMeter``: the kind, the group (so the mesh
dimension), the bytes of the full tensor, and the clock's marks at issue and at completion.
How a call completes:

* a blocking call, or a functional collective (waited for at once: the op after it needs
  its result anyway): when it returns;
* an asynchronous collective with a future: a callback on the future marks the end (on a GPU
  the callback runs in stream order after the collective, so a device clock's mark there is
  the collective's end); ``CommMeter.settle`` waits for those callbacks, so a step's record
  is complete before it is read;
* a work without a future (gloo's reduce-scatter): waited for at once;
* point-to-point works (``isend``, ``irecv``, ``batch_isend_irecv``; gloo gives them no
  future): returned wrapped, and marked done when the caller waits for them.

Only communication pays for this (a ``TorchDispatchMode`` would put Python in front of every
op of the step: on small models that doubled the step time). Not counted: functions imported
by name before the meter was entered (DTensor's ``mesh_broadcast``, not used in steps).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.distributed.distributed_c10d as c10d

from labkit.runtime.comm.meter import CommMeter, Once

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
_P2P = {"send": "send", "recv": "recv", "isend": "send", "irecv": "recv"}
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
    """The meter to record into, or None (no meter, or inside another wrapped call)."""
    depth = getattr(_local, "depth", 0)
    _local.depth = depth + 1
    try:
        active = list(_active)  # a snapshot: another thread may exit a meter meanwhile
        yield active[-1] if depth == 0 and active else None
    finally:
        _local.depth = depth


def _group_size(group) -> int:
    if not dist.is_initialized():
        return 1
    try:
        if isinstance(group, (dist.ProcessGroup, type(None))):
            return dist.get_world_size(group)
        return funcol._expand_group(group)[2]  # a mesh, (mesh, dim), ranks or a name
    except Exception:  # noqa: BLE001 - the size only scales the wire bytes
        return dist.get_world_size()


def _wrap(original, kind: str, complete):
    """``original`` with its call recorded: ``complete(out, arguments, done, meter)`` says how
    the call ends, arranges ``done(nbytes)`` to run when it has, and returns the result."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def communicate(*args, **kwargs):
        with _outermost() as meter:
            if meter is None:
                return original(*args, **kwargs)
            bound = signature.bind(*args, **kwargs).arguments
            group = bound.get("group")
            size, start = _group_size(group), meter.clock.mark()
            out = original(*args, **kwargs)

            def done(nbytes: int) -> None:
                meter.record(group, kind, nbytes, size, start, meter.clock.mark())

            return complete(out, bound, done, meter)

    return communicate


def _complete_collective(argument: str):
    def complete(work, bound, done, meter):
        nbytes = _nbytes(bound.get(argument))
        if work is None:  # blocking call: it is done
            done(nbytes)
            return work
        try:
            future = work.get_future()
        except RuntimeError:  # a work without a future: wait for it here
            work.wait()
            done(nbytes)
            return work

        def finished(_future) -> None:
            try:
                done(nbytes)
            finally:
                meter.end()

        meter.begin()
        future.then(finished)
        return work

    return complete


class _TimedWork:
    """A point-to-point work that records its transfer (``once``) when the caller waits for
    it (gloo's have no future); ``CommMeter.settle`` waits for any the caller left."""

    def __init__(self, work, once: Once):
        self._work, self._once = work, once

    def wait(self, *args, **kwargs):
        if self._once.fired:  # waited for already: a gloo work would block a second time
            return True
        result = self._work.wait(*args, **kwargs)
        self._once()
        return result

    def __bool__(self) -> bool:
        return True

    def __getattr__(self, name):
        return getattr(self._work, name)


def _timed(work, once: Once, meter) -> _TimedWork:
    timed = _TimedWork(work, once)
    meter.watch(timed, once)
    return timed


def _complete_p2p(blocking: bool):
    def complete(work, bound, done, meter):
        nbytes = _nbytes(bound.get("tensor"))
        if blocking or work is None:  # send or recv: done when they return (recv: the sender)
            done(nbytes)
            return work
        return _timed(work, Once(lambda: done(nbytes)), meter)

    return complete


def _complete_batch(works, bound, meter, start):
    """``batch_isend_irecv``: each op is recorded (as a send or a receive) once every work of
    the batch has been waited for (NCCL coalesces them into one)."""
    ops, left = list(bound["p2p_op_list"]), [max(len(works), 1)]
    lock = threading.Lock()

    def one_done() -> None:
        with lock:
            left[0] -= 1
            if left[0]:
                return
        end = meter.clock.mark()
        for op in ops:
            kind = "send" if op.op is c10d.isend else "recv"
            meter.record(op.group, kind, op.tensor.nbytes, _group_size(op.group), start, end)

    if not works:  # nothing to wait for
        one_done()
        return works
    return [_timed(work, Once(one_done), meter) for work in works]


def _wrap_batch(original):
    signature = inspect.signature(original)

    @functools.wraps(original)
    def batch_isend_irecv(*args, **kwargs):
        with _outermost() as meter:
            if meter is None:
                return original(*args, **kwargs)
            bound = signature.bind(*args, **kwargs).arguments
            start = meter.clock.mark()
            return _complete_batch(original(*args, **kwargs), bound, meter, start)

    return batch_isend_irecv


def _wrap_funcol(name: str, original):
    kind = _FUNCOL[name]

    def complete(out, bound, done, meter):
        if isinstance(out, funcol.AsyncCollectiveTensor):
            out.trigger_wait()
        else:
            torch.ops._c10d_functional.wait_tensor(out)
        done(_nbytes(out) if kind == "all_gather" else _nbytes(bound["self"]))
        return out

    return _wrap(original, kind, complete)


def _wrapper(name: str, original):
    if name in _DIST:
        kind, argument = _DIST[name]
        return _wrap(original, kind, _complete_collective(argument))
    if name in _P2P:
        return _wrap(original, _P2P[name], _complete_p2p(blocking=name in ("send", "recv")))
    return _wrap_batch(original)


def _set(module, name: str, value) -> None:
    _originals.setdefault((module, name), getattr(module, name))
    setattr(module, name, value)


def _install() -> None:
    """Replace every communication function by its wrapper, all or none. ``dist.isend`` and
    ``c10d.isend`` get the same wrapper: ``batch_isend_irecv`` tells sends from receives by
    identity."""
    try:
        for name in (*_DIST, *_P2P, "batch_isend_irecv"):
            original = getattr(c10d, name)
            wrapper = _wrapper(name, original)
            _set(c10d, name, wrapper)
            if getattr(dist, name, None) is original:
                _set(dist, name, wrapper)
        for name in _FUNCOL:
            _set(funcol, name, _wrap_funcol(name, getattr(funcol, name)))
    except Exception:
        _uninstall()
        raise


def _uninstall() -> None:
    for (module, name), original in _originals.items():
        setattr(module, name, original)
    _originals.clear()


class CollectiveMeter:
    """Record the communication issued inside ``with CollectiveMeter(meter):`` into
    ``meter`` (a ``CommMeter``), then ``meter.settle()`` on leaving, so that what ran in the
    block is all recorded when the block ends. Meters may nest (the innermost records). The
    functions are restored when the last meter exits, whatever happened inside.
    """

    def __init__(self, meter: CommMeter):
        self.meter = meter

    def __enter__(self) -> CommMeter:
        with _lock:
            if not _active:
                _install()
            _active.append(self.meter)
        return self.meter

    def __exit__(self, exc_type, *exc) -> None:
        try:
            self.meter.settle(wait=exc_type is None)
        finally:
            with _lock:
                try:
                    index = max(i for i, m in enumerate(_active) if m is self.meter)
                    del _active[index]
                finally:
                    if not _active:
                        _uninstall()
