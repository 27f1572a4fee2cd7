"""What a rank sends back, made so that nothing a learner's code does can break the sending:
errors whose ``__str__`` raises or whose class cannot be rebuilt elsewhere, results on a GPU,
and where a rank is stuck when a run times out."""

from __future__ import annotations

import io
import sys
import traceback

import cloudpickle
import torch


def safe_str(value: object) -> str:
    """``str(value)``, or a note saying that its ``__str__`` raised."""
    try:
        return str(value)
    except BaseException as exc:  # noqa: BLE001 - any user __str__ may fail any way
        return f"<{type(value).__name__}.__str__ raised {type(exc).__name__}>"


def _format(exc: BaseException, tb) -> str:
    try:
        return "".join(traceback.format_exception(type(exc), exc, tb))
    except BaseException:  # noqa: BLE001
        lines = traceback.format_tb(tb) if tb is not None else []
        return "Traceback (most recent call last):\n" + "".join(lines) + (
            f"{type(exc).__name__}: {safe_str(exc)}\n")


def error_message(job_id: int | None, exc: BaseException, skip_frames: int = 0) -> tuple:
    """An 'error' message; ``skip_frames`` drops labkit's own frames from the traceback.

    The exception object travels too when it survives a pickle round trip here (its class
    must also exist in the notebook: the notebook checks that again)."""
    tb = exc.__traceback__
    for _ in range(skip_frames):
        tb = tb.tb_next if tb is not None and tb.tb_next is not None else tb
    text = _format(exc, tb)
    try:
        exc_bytes = cloudpickle.dumps(exc)
        cloudpickle.loads(exc_bytes)
    except BaseException:  # noqa: BLE001 - any exception may refuse pickling; send text only
        exc_bytes = None
    return ("error", job_id, type(exc).__name__, safe_str(exc), text, exc_bytes)


def on_device(tensor: torch.Tensor) -> bool:
    """A tensor whose memory is on an accelerator (it must come back as a host copy)."""
    return tensor.device.type not in ("cpu", "meta")


def host_copy(tensor: torch.Tensor) -> torch.Tensor:
    copy = tensor.detach().to("cpu", copy=True)
    if isinstance(tensor, torch.nn.Parameter):
        return torch.nn.Parameter(copy, requires_grad=tensor.requires_grad)
    return copy.requires_grad_(tensor.requires_grad and tensor.is_leaf)


class _HostPickler(cloudpickle.CloudPickler):
    """cloudpickle, with every tensor on a GPU replaced by a host copy: unpickled in the
    notebook it would land on a GPU there, outside every cap (and initialise CUDA)."""

    def reducer_override(self, obj):
        if (isinstance(obj, torch.Tensor) and type(obj).__name__ != "DTensor"
                and on_device(obj)):
            return host_copy(obj).__reduce_ex__(self.proto)
        return super().reducer_override(obj)


def dumps_result(value) -> bytes:
    buffer = io.BytesIO()
    _HostPickler(buffer, protocol=cloudpickle.DEFAULT_PROTOCOL).dump(value)
    return buffer.getvalue()


def where(thread_id: int) -> list[tuple[str, int, str, str]]:
    """(file, line, function, source) of each frame of thread ``thread_id``, outermost first."""
    frame = sys._current_frames().get(thread_id)
    if frame is None:
        return []
    return [(f.filename, f.lineno or 0, f.name, f.line or "")
            for f in traceback.extract_stack(frame)]


def in_collective(frames) -> str | None:
    """The torch.distributed call a stack is waiting in (e.g. "all_reduce"), or None."""
    paths = [(filename.replace("\\", "/"), name) for filename, _, name, _ in frames]
    c10d = [n for p, n in paths if p.endswith("distributed_c10d.py") and not n.startswith("_")]
    names = [n for p, n in paths if "torch/distributed/" in p and n != "wrapper"]
    return (c10d or names or [None])[0]


def user_frame(frames) -> str:
    """Where a stack is in the learner's code: the innermost frame outside torch and labkit."""
    for filename, lineno, name, line in reversed(frames):
        path = filename.replace("\\", "/")
        if "/torch/" not in path and "/labkit/" not in path and "threading.py" not in path:
            return f"{filename}:{lineno} in {name}" + (f": {line.strip()}" if line else "")
    if frames:
        filename, lineno, name, _ = frames[-1]
        return f"{filename}:{lineno} in {name}"
    return "unknown"
