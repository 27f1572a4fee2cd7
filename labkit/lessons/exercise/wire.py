"""Count what a learner's function sends on a rank: point-to-point bytes and collectives.

``Traffic`` wraps ``torch.distributed``'s point-to-point functions (``send``, ``recv``,
``isend``, ``irecv``; ``batch_isend_irecv`` goes through the last two) while it is entered,
and counts collectives with the suite's ``CollectiveMeter`` (``labkit/runtime/comm/intercept.py``),
so a check can compare the bytes a rank sent, and which collectives ran, with what the reference
algorithm does. Calls are counted when made through the module (``dist.send(...)``), as the
notebooks write them; ``send`` calls ``isend`` inside torch, so only the outermost call counts.
"""

from __future__ import annotations

import threading

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from labkit.runtime.comm.intercept import CollectiveMeter
from labkit.runtime.comm.meter import CommMeter

_P2P = ("send", "recv", "isend", "irecv")
_depth = threading.local()


class Traffic:
    """``with Traffic() as traffic:`` ... then ``traffic.sent_bytes``, ``traffic.collectives``.

    Attributes:
        sent_bytes, received_bytes: point-to-point bytes of this rank.
        sends, recvs: number of point-to-point calls.
        largest_send: the bytes of the largest single message sent (a ring sends chunks).
        collectives: {kind: [calls, bytes]} of the collectives issued inside.
    """

    def __init__(self):
        self.sent_bytes = self.received_bytes = self.sends = self.recvs = 0
        self.largest_send = 0
        self.collectives: dict[str, list] = {}
        self._meter = CommMeter()
        self._collective_meter = CollectiveMeter(self._meter)
        self._originals: dict[tuple[object, str], object] = {}

    def _wrap(self, name: str, original):
        def counted(tensor, *args, **kwargs):
            depth = getattr(_depth, "value", 0)
            if depth == 0:
                if name in ("send", "isend"):
                    self.sends, self.sent_bytes = self.sends + 1, self.sent_bytes + tensor.nbytes
                    self.largest_send = max(self.largest_send, tensor.nbytes)
                else:
                    self.recvs += 1
                    self.received_bytes += tensor.nbytes
            _depth.value = depth + 1
            try:
                return original(tensor, *args, **kwargs)
            finally:
                _depth.value = depth

        return counted

    def __enter__(self) -> Traffic:
        wrapped = {name: self._wrap(name, getattr(c10d, name)) for name in _P2P}
        for module in (dist, c10d):
            for name in _P2P:
                self._originals[module, name] = getattr(module, name)
                setattr(module, name, wrapped[name])
        self._collective_meter.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._collective_meter.__exit__(*exc)
        for (module, name), original in self._originals.items():
            setattr(module, name, original)
        # the meter files point-to-point transfers too; they are counted above, by call
        self.collectives = {kind: [int(v[0]), int(v[1])]
                            for kind, v in self._meter.by_kind.items()
                            if kind not in ("send", "recv")}

    def to_dict(self) -> dict:
        return {"sent_bytes": self.sent_bytes, "received_bytes": self.received_bytes,
                "sends": self.sends, "recvs": self.recvs, "largest_send": self.largest_send,
                "collectives": self.collectives}
