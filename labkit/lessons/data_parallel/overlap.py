"""DDP's overlap, shown: when each bucket's AllReduce ran, drawn over the backward pass.

``bucket_timeline(cluster, model, global_batch, bucket_cap_mb)`` wraps a zoo model in
PyTorch's ``DistributedDataParallel`` on every rank, with a communication hook that does what
DDP's default hook does (divide the bucket by the group's size, AllReduce it) and notes when
DDP handed it each bucket (*issued*: every gradient of the bucket is ready) and when its
AllReduce completed (*done*). It trains a few steps (DDP rebuilds its buckets after the
first, in the order gradients became ready) and keeps the last step's marks, in seconds from
the start of backward, with DDP's own bucket count (its logging data) to compare against.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

STEPS = 3  # step 1 makes the buckets, step 2 runs on the rebuilt ones; the last is kept


@dataclass
class BucketTimeline:
    """The last step of rank 0 (every rank's marks are in ``ranks``).

    Attributes:
        buckets: per bucket, in the order DDP issued them: {"index", "bytes", "issued",
            "done"} (seconds from backward's start).
        backward_s: from backward's start until ``loss.backward()`` returned (DDP waits for
            every bucket's AllReduce before it returns).
        ddp_buckets: how many buckets DDP itself says it made (``rebuilt_bucket_sizes``).
    """

    model: str
    bucket_cap_mb: float
    world_size: int
    buckets: list[dict]
    backward_s: float
    ddp_buckets: int
    ranks: list[dict] = field(default_factory=list)
    setup: str = ""  # what else was run (``timeline_setup``): a cache compares it

    @property
    def compute_end_s(self) -> float:
        """When the last bucket was issued: its gradients, the last ones, were ready."""
        return max(b["issued"] for b in self.buckets)

    @property
    def exposed_s(self) -> float:
        """Communication backward waited for once its computation was done."""
        return max(0.0, self.backward_s - self.compute_end_s)

    def to_dict(self) -> dict:
        return dict(self.__dict__, compute_end_s=self.compute_end_s, exposed_s=self.exposed_s)


def _timed_hook(marks: list, clock):
    """DDP's default averaging, with a clock mark at issue and at completion.

    On a GPU the host only queues work, and the future's callback may run before NCCL is done:
    the marks are the clock's (``runtime/comm/clock.py``: CUDA events; the callback runs on streams
    that wait for the AllReduce), resolved to seconds after backward."""
    import torch.distributed as dist

    def hook(state, bucket):  # no annotations: DDP checks them against dist.GradBucket
        issued = clock.mark()  # every gradient of the bucket is ready (on the device)
        tensor = bucket.buffer()  # every gradient of the bucket, one flat tensor
        tensor.div_(dist.get_world_size())
        index, nbytes = bucket.index(), tensor.numel() * tensor.element_size()

        def done(future):
            marks.append({"index": index, "bytes": nbytes, "issued": issued,
                          "done": clock.mark()})
            return future.value()[0]

        return dist.all_reduce(tensor, async_op=True).get_future().then(done)

    return hook


def _on_rank(ctx, model_config, global_batch: int, bucket_cap_mb: float) -> dict:
    import torch
    from torch.nn.parallel import DistributedDataParallel

    from labkit.models import build_model, loss_fn, make_batch, to_device
    from labkit.runtime.comm.clock import clock_for

    clock = clock_for(ctx.device)
    model = build_model(model_config, ctx.device)
    device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    ddp = DistributedDataParallel(model, device_ids=device_ids, bucket_cap_mb=bucket_cap_mb)
    marks: list[dict] = []
    ddp.register_comm_hook(None, _timed_hook(marks, clock))
    optimizer = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    per_rank = global_batch // ctx.world_size
    for step in range(STEPS):
        inputs, targets = to_device(make_batch(model_config, step, per_rank, seed=ctx.rank),
                                    ctx.device, copy=True)
        loss = loss_fn(model_config)(ddp(inputs), targets)
        marks.clear()
        clock.start()
        start = clock.mark()
        loss.backward()
        end = clock.mark()
        clock.synchronize()
        optimizer.step()
        optimizer.zero_grad()
    def since(mark) -> float:
        return clock.seconds(mark) - clock.seconds(start)

    buckets = [dict(b, issued=since(b["issued"]), done=since(b["done"])) for b in marks]
    sizes = ddp._get_ddp_logging_data().get("rebuilt_bucket_sizes", "")
    return {"buckets": sorted(buckets, key=lambda b: b["issued"]), "backward_s": since(end),
            "ddp_buckets": len([s for s in str(sizes).split(",") if s.strip()])}


def check_bucket_cap(bucket_cap_mb) -> None:
    """A positive, finite number of megabytes whose bytes fit DDP's 64-bit counter."""
    if isinstance(bucket_cap_mb, bool) or not isinstance(bucket_cap_mb, numbers.Real):
        raise TypeError(f"bucket_cap_mb is a number of megabytes (e.g. 25), not "
                        f"{bucket_cap_mb!r}")
    if not (math.isfinite(bucket_cap_mb) and 0 < bucket_cap_mb * 2**20 < 2**63):
        raise ValueError(f"bucket_cap_mb must be positive and finite (DDP's default is 25; "
                         f"a value larger than the gradients makes one bucket), not "
                         f"{bucket_cap_mb}")


def timeline_setup(cluster, model, global_batch: int) -> str:
    """Everything a timeline depends on but its cap: the model config, batch and ranks."""
    from labkit.models import config_for

    config = config_for(model) if isinstance(model, str) else model
    return repr((config, global_batch, cluster.world_size, cluster.device))


def bucket_timeline(cluster, model, global_batch: int = 64,
                    bucket_cap_mb: float = 25.0) -> BucketTimeline:
    """One DDP step's buckets on ``cluster`` for zoo ``model`` (a config, or a name)."""
    from labkit.models import config_for

    check_bucket_cap(bucket_cap_mb)
    if isinstance(global_batch, bool) or not isinstance(global_batch, int) or global_batch < 1:
        raise ValueError(f"global_batch is a positive whole number of samples, not "
                         f"{global_batch!r}")
    if global_batch % cluster.world_size:
        raise ValueError(f"global_batch ({global_batch}) must split evenly over "
                         f"{cluster.world_size} ranks")
    config = config_for(model) if isinstance(model, str) else model
    ranks = list(cluster.run(_on_rank, config, global_batch, bucket_cap_mb))
    first = ranks[0]
    return BucketTimeline(type(config).__name__.removesuffix("Config").lower(), bucket_cap_mb,
                          cluster.world_size, first["buckets"], first["backward_s"],
                          first["ddp_buckets"], ranks,
                          timeline_setup(cluster, config, global_batch))
