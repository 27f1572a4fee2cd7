"""Reading a DCP checkpoint that code this process does not trust wrote (a learner's, on the
ranks): its tensors and plain values, never its code.

DCP's own reader is not for that. ``FileSystemReader.read_metadata`` unpickles ``.metadata``
with ``pickle.load``, and a pickle is a program (an object whose ``__reduce__`` names
``os.system`` runs it); its loader reads every entry that is not a tensor with
``torch.load(weights_only=False)``. Here ``.metadata`` is read by ``MetadataUnpickler``, which
rebuilds DCP's own records (``Metadata`` and what it holds: storage records, ``torch.Size``,
dtypes, layouts) and refuses any other class or function before calling it; tensors and the
other entries (a step, Adam's settings) go through ``torch.load(weights_only=True)``. Files are
opened only as plain files of the folder itself (no links, no paths), and what is read is
capped: a checkpoint of notebook 10's small MLP is tens of kilobytes.

    found = read_checkpoint(folder)   # raises Unreadable, saying why
    found.tensors["train.model.layers.0.weight"], found.values["train.step"]
"""

from __future__ import annotations

import dataclasses
import io
import math
import os
import pickle
import re
import stat

import torch
from torch.distributed.checkpoint import filesystem
from torch.distributed.checkpoint import metadata as dcp_metadata

METADATA_FILE = ".metadata"
MAX_FILE_BYTES = 8 * 2**20  # .metadata, and the most read from the data files in all
MAX_ENTRIES = 1_000
MAX_DEPTH = 8  # how deeply a plain value (Adam's settings: a dict of lists) may nest
_FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")  # "__0_0.distcp": no folders, no ".."

# The classes and functions a ``.metadata`` that DCP wrote names (torch 2.x), and nothing else.
_DCP_RECORDS = {
    ("torch.distributed.checkpoint.metadata", name): getattr(dcp_metadata, name)
    for name in ("Metadata", "TensorStorageMetadata", "BytesStorageMetadata",
                 "ChunkStorageMetadata", "TensorProperties", "MetadataIndex", "StorageMeta",
                 "_MEM_FORMAT_ENCODING")}
_DCP_RECORDS[("torch.distributed.checkpoint.filesystem", "_StorageInfo")] = \
    filesystem._StorageInfo
_DCP_RECORDS[("torch.serialization", "_get_layout")] = torch.serialization._get_layout
_DCP_RECORDS[("torch", "Size")] = torch.Size
_PATHS = ("PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath")  # a checkpoint_id


class Unreadable(Exception):
    """The folder holds no checkpoint this module reads; the message says why."""


# The records whose state a pickle may set (BUILD): instances of DCP's dataclasses, made by
# this unpickling. Never a class, a function (``_get_layout.cache``) or an enum's member
# (``_MEM_FORMAT_ENCODING.TORCH_CONTIGUOUS_FORMAT._value_``): those are this process's own.
_BUILDABLE = frozenset(value for value in _DCP_RECORDS.values() if isinstance(value, type)
                       and dataclasses.is_dataclass(value))


class MetadataUnpickler(pickle._Unpickler):
    """Builds DCP's metadata records and refuses any other global. Python's own unpickler,
    with one opcode changed: BUILD (set an object's state) is allowed only on an instance of
    one of DCP's dataclasses, so that a pickle cannot change anything of this process (a
    class, ``Metadata.__eq__ = ...``; a function's attributes; an enum's members)."""

    dispatch = dict(pickle._Unpickler.dispatch)

    def find_class(self, module: str, name: str):
        if (module, name) in _DCP_RECORDS:
            return _DCP_RECORDS[(module, name)]
        value = vars(torch).get(name) if module == "torch" else None  # no lazy imports
        if isinstance(value, torch.dtype | torch.layout | torch.memory_format):
            return value
        if module == "pathlib" and name in _PATHS:
            import pathlib

            return getattr(pathlib, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not one of DCP's metadata records")

    def _build(self):
        target = self.stack[-2]
        if type(target) not in _BUILDABLE:
            what = "class" if isinstance(target, type) else type(target).__name__
            raise pickle.UnpicklingError(f"the pickle sets the state of a {what}, not of "
                                         "one of DCP's records")
        pickle._Unpickler.load_build(self)

    dispatch[pickle.BUILD[0]] = _build


def _open(folder: str, name: str) -> int:
    """A descriptor of ``folder/name``, a plain file (not a link, a pipe or a folder)."""
    if not isinstance(name, str) or not (_FILE_NAME.fullmatch(name) or name == METADATA_FILE):
        raise Unreadable(f"the metadata names a file {name!r} outside the checkpoint's folder")
    try:
        fd = os.open(os.path.join(folder, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as error:
        raise Unreadable(f"{name} could not be opened ({error.strerror})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise Unreadable(f"{name} is not a plain file")
    return fd


def _read(folder: str, name: str, offset: int, length: int) -> bytes:
    fd = _open(folder, name)
    try:
        data = os.pread(fd, length, offset)
    finally:
        os.close(fd)
    if len(data) != length:
        raise Unreadable(f"{name} ends before the {length} bytes at {offset} its metadata names")
    return data


def read_metadata(folder: str) -> dcp_metadata.Metadata:
    """``folder``'s ``.metadata``, unpickled by ``MetadataUnpickler`` (raises Unreadable)."""
    fd = _open(folder, METADATA_FILE)
    try:
        if os.fstat(fd).st_size > MAX_FILE_BYTES:
            raise Unreadable(f"{METADATA_FILE} is larger than {MAX_FILE_BYTES} bytes")
        data = os.read(fd, MAX_FILE_BYTES + 1)
    finally:
        os.close(fd)
    try:
        found = MetadataUnpickler(io.BytesIO(data)).load()
    except Exception as error:  # noqa: BLE001 - any malformed pickle: not read, and why
        raise Unreadable(f"its {METADATA_FILE} is not DCP's metadata: {error}") from None
    if not isinstance(found, dcp_metadata.Metadata):
        raise Unreadable(f"its {METADATA_FILE} holds a {type(found).__name__}, not DCP's "
                         "Metadata")
    return found


@dataclasses.dataclass
class Checkpoint:
    """What a checkpoint holds, by DCP's keys: whole tensors, and the plain values."""

    tensors: dict[str, torch.Tensor]
    values: dict[str, object]


def _storage(meta) -> dict:
    """{(key, chunk offset or None): (file, offset, length)}, from checked records only."""
    where = {}
    items = meta.storage_data.items() if isinstance(meta.storage_data, dict) else None
    if items is None or len(meta.storage_data) > MAX_ENTRIES * 8:
        raise Unreadable("its metadata has no storage records DCP writes")
    for index, info in items:
        if not (isinstance(index, dcp_metadata.MetadataIndex) and isinstance(index.fqn, str)
                and isinstance(info, filesystem._StorageInfo)
                and type(info.offset) is int and type(info.length) is int
                and 0 <= info.offset and 0 <= info.length <= MAX_FILE_BYTES
                and not getattr(info, "transform_descriptors", None)):
            raise Unreadable("its metadata has a storage record DCP does not write")
        offset = None if index.offset is None else _shape(index.offset)
        where[(index.fqn, offset)] = (info.relative_path, info.offset, info.length)
    return where


def _shape(size) -> tuple[int, ...]:
    if not (isinstance(size, torch.Size) and all(type(n) is int and n >= 0 for n in size)):
        raise Unreadable("its metadata has a tensor size that is not a torch.Size")
    return tuple(size)


def _load(data: bytes, key: str):
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - not plain data: named, not read
        raise Unreadable(f"its entry {key!r} is not a tensor or a plain value that "
                         f"torch.load(weights_only=True) reads ({type(error).__name__})") from None


def _tensor(folder: str, key: str, record, where: dict, budget: list[int]) -> torch.Tensor:
    properties, size = record.properties, _shape(record.size)
    dtype = getattr(properties, "dtype", None)
    if not isinstance(dtype, torch.dtype) or not isinstance(record.chunks, list):
        raise Unreadable(f"its entry {key!r} has no dtype or chunks")
    memory = math.prod(size) * (dtype.itemsize + 1)  # the tensor and what its chunks cover
    if memory > budget[1]:  # before any memory is taken for it: a running total
        raise Unreadable(f"it holds more than {MAX_FILE_BYTES} bytes of tensors")
    budget[1] -= memory
    whole = torch.zeros(size, dtype=dtype)
    covered = torch.zeros(size, dtype=torch.bool)
    for chunk in record.chunks:
        offsets, sizes = _shape(chunk.offsets), _shape(chunk.sizes)
        if len(offsets) != len(size) or len(sizes) != len(size):
            raise Unreadable(f"its entry {key!r} has a chunk of another shape")
        if (key, offsets) not in where:
            raise Unreadable(f"its entry {key!r} has a chunk without a storage record")
        name, start, length = where[(key, offsets)]
        budget[0] -= length
        if budget[0] < 0:
            raise Unreadable(f"it holds more than {MAX_FILE_BYTES} bytes")
        part = _load(_read(folder, name, start, length), key)
        region = tuple(slice(o, o + n) for o, n in zip(offsets, sizes, strict=True))
        if not isinstance(part, torch.Tensor) or tuple(part.shape) != sizes \
                or part.dtype != dtype or tuple(whole[region].shape) != sizes:
            raise Unreadable(f"its entry {key!r} holds a chunk its metadata does not describe")
        whole[region] = part
        covered[region] = True
    if not bool(covered.all()):
        raise Unreadable(f"its entry {key!r} is not covered by its chunks")
    return whole


def read_checkpoint(folder: str) -> Checkpoint:
    """Every entry of the DCP checkpoint in ``folder`` (raises Unreadable, saying why)."""
    try:
        return _read_checkpoint(folder)
    except Unreadable:
        raise
    except Exception as error:  # noqa: BLE001 - a dtype torch cannot make, memory: not read
        raise Unreadable(f"it could not be read ({type(error).__name__})") from None


def _plain_value(value, key: str, budget: list[int]):
    """``value`` if its tensors (a tensor may view a one-byte storage as gigabytes) fit what
    is left of the memory budget, and it is a plain value: nested at most ``MAX_DEPTH`` deep,
    of at most ``MAX_ENTRIES`` items in all (a list holding one list many times over would
    otherwise be walked exponentially often)."""
    items = [0]

    def weigh(item, depth: int) -> None:
        items[0] += 1
        if items[0] > MAX_ENTRIES or depth > MAX_DEPTH:
            raise Unreadable(f"its entry {key!r} is not a plain value (too deep or too many "
                             "items)")
        if isinstance(item, torch.Tensor):
            budget[1] -= item.numel() * item.element_size()
        elif isinstance(item, dict | list | tuple):
            for inner in (item.values() if isinstance(item, dict) else item):
                weigh(inner, depth + 1)
    weigh(value, 0)
    if budget[1] < 0:
        raise Unreadable(f"its entry {key!r} holds more than {MAX_FILE_BYTES} bytes")
    return value


def _read_checkpoint(folder: str) -> Checkpoint:
    if os.path.islink(folder) or not os.path.isdir(folder):
        raise Unreadable("the checkpoint's folder is a link, or not a folder")
    meta = read_metadata(folder)
    entries = meta.state_dict_metadata
    if not isinstance(entries, dict) or len(entries) > MAX_ENTRIES:
        raise Unreadable("its metadata lists no entries DCP writes")
    where, budget = _storage(meta), [MAX_FILE_BYTES, MAX_FILE_BYTES]  # bytes read, memory
    found = Checkpoint({}, {})
    for key, record in entries.items():
        if not isinstance(key, str):
            raise Unreadable("its metadata has an entry whose key is not a string")
        if isinstance(record, dcp_metadata.TensorStorageMetadata):
            found.tensors[key] = _tensor(folder, key, record, where, budget)
        elif isinstance(record, dcp_metadata.BytesStorageMetadata) and (key, None) in where:
            name, start, length = where[(key, None)]
            budget[0] -= length
            if budget[0] < 0:
                raise Unreadable(f"it holds more than {MAX_FILE_BYTES} bytes")
            found.values[key] = _plain_value(_load(_read(folder, name, start, length), key),
                                             key, budget)
        else:
            raise Unreadable(f"its entry {key!r} is neither a tensor nor bytes DCP wrote")
    return found
