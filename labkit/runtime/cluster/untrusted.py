"""Reading what ranks send when the code on them is not trusted (a grader checking a learner's
function): plain data and tensors only, never code.

A pickle is a program: ``cloudpickle.loads`` of bytes a rank chose runs whatever the rank
wanted in this process, and a learner's function on a rank can send any bytes down its
connection, or return an object whose ``__reduce__`` does. ``python -m labkit grade`` runs its
checks in a process that calls ``distrust_ranks()`` before anything else; from then on every
message and result from a rank is read by ``loads`` below, which rebuilds builtin values,
tensors (storages through ``torch.load(weights_only=True)``), dtypes, builtin exceptions and
``DeviceOOM``, and refuses any other class or function (``UntrustedPickle``). In a lesson
nothing changes: ranks run the learner's own code for the learner.
"""

from __future__ import annotations

import builtins
import collections
import io
import pickle

import torch

_DISTRUSTED = False
_CONTAINED = False


class UntrustedPickle(pickle.UnpicklingError):
    """A rank sent something other than plain data and tensors while ranks are distrusted."""


def distrust_ranks(contained: bool = False) -> None:
    """From now on, in this process, read everything ranks send with ``loads`` (no way back).
    ``contained``: this process runs in a pid namespace of its own (the grader's sandbox),
    where every other process is learner code, held (stopped or killed) while a rank launcher
    starts (``launcher.others_held``)."""
    global _DISTRUSTED, _CONTAINED
    _DISTRUSTED, _CONTAINED = True, _CONTAINED or contained


def distrusted() -> bool:
    return _DISTRUSTED


def contained() -> bool:
    return _CONTAINED


def _load_storage(data: bytes):
    return torch.load(io.BytesIO(data), weights_only=True)


_SAFE_BUILTINS = {"set", "frozenset", "bytearray", "complex", "slice", "range"}


def _allowed(module: str, name: str):
    if module == "builtins":
        value = getattr(builtins, name, None)
        if name in _SAFE_BUILTINS or (isinstance(value, type)
                                      and issubclass(value, BaseException)):
            return value
    elif module == "torch._utils" and name in ("_rebuild_tensor_v2", "_rebuild_parameter"):
        return getattr(torch._utils, name)
    elif module == "torch.storage" and name == "_load_from_bytes":
        return _load_storage
    elif module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
        return getattr(torch, name)
    elif module == "torch" and name in ("Size", "device"):
        return getattr(torch, name)
    elif (module, name) == ("collections", "OrderedDict"):
        return collections.OrderedDict
    elif (module, name) == ("labkit.runtime.memory.oom", "DeviceOOM"):
        from labkit.runtime.memory.oom import DeviceOOM

        return DeviceOOM
    return None


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        found = _allowed(module, name)
        if found is None:
            raise UntrustedPickle(f"{module}.{name} is not rebuilt from an untrusted rank: "
                                  "return plain values (numbers, strings, lists, dicts) or "
                                  "tensors")
        return found

    def persistent_load(self, pid):
        raise UntrustedPickle("persistent ids are not read from an untrusted rank")


def loads(data: bytes):
    """``pickle.loads`` limited to plain data and tensors when ranks are distrusted; the
    ordinary ``cloudpickle.loads`` otherwise."""
    if not _DISTRUSTED:
        import cloudpickle

        return cloudpickle.loads(data)
    return _Unpickler(io.BytesIO(data)).load()
