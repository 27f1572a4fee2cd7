"""What of a step's communication the step waits for: each collective beside the compute it
can run under, as the run's framework schedules it (``project.py`` times the collectives,
this file overlaps them)."""

from __future__ import annotations

from labkit.plan.frameworks import framework
from labkit.plan.levers import Lever


def hiding_window_s(dim: str, kind: str, lever: Lever, compute: float,
                    pipelined: bool = False) -> float:
    """Seconds of compute a (dim, kind) collective of the data-parallel gradients or
    parameters can run under, as the frameworks schedule them over a step's micro-batches.

    * A reduction done once a step runs under the last micro-batch's backward only: torch
      DDP and FSDP keep the gradients local under ``no_sync`` (FSDP2:
      ``set_requires_gradient_sync(False)``) and reduce in the backward that leaves it;
      Megatron-Core's buckets register gradients as ready only "when processing the last
      microbatch" (``param_and_grad_buffer.py`` ``register_grad_ready``, f2e5db402c;
      ``schedules.py`` runs the first m-1 micro-batches under ``no_sync_func``). Reduced
      after every micro-batch (Composer's FSDP), it runs under every backward.
    * The distributed optimizer's parameter all-gather (once a step) runs under the next
      step's first forward: Megatron-Core launches it after the optimizer step and waits in
      each module's forward pre-hook (``distrib_optimizer.py`` ``step_with_ready_grads``:
      "asynchronous all-gathers that get overlapped with the next forward pass"); later
      micro-batches find the parameters gathered.
    * FSDP's all-gathers run in every micro-batch's forward and backward: under all of it;
      in its forward only where the gathered parameters are kept to backward
      (``Framework.reshards_after_forward`` False), and in a pipeline, which keeps them to
      the step's end then, in the first micro-batch's forward.
    * In torch.distributed.pipelining, a stage's gradient reduction (FSDP's reduce-scatter,
      ``replicate``'s and HSDP's all-reduce) runs after its last backward
      (``perform_reduce_grad``: "REDUCE_GRAD action is scheduled after all microbatches W,
      B actions"): under nothing.
    Backward is taken as 2/3 of the compute (twice the forward's FLOPs)."""
    m = max(lever.micro_batches, 1)
    backward, forward = compute * 2 / 3, compute / 3
    if kind == "all_gather" and dim == "fsdp":
        if framework(lever.framework).reshards_after_forward(pipelined):
            return compute
        return forward / m if pipelined else forward
    if (pipelined and kind in ("all_reduce", "reduce_scatter")
            and framework(lever.framework).torch_pipelining):
        return 0.0  # after the stage's last backward (Framework.torch_pipelining)
    if kind == "all_gather":
        return forward / m
    once = dim == "dp" or not framework(lever.framework).reduce_every_micro_batch
    if kind in ("all_reduce", "reduce_scatter") and once:
        return backward / m
    return backward


def exposed_s(layout, cluster, lever, costs, compute, busy, critical, by_kind) -> dict:
    """{dim: seconds of its communication the step waits for}, as the framework overlaps it:
    each data-parallel collective beyond the compute it can run under
    (``hiding_window_s``), all of them beyond the compute they share, and never less than
    their last call (a bucket reduced after the last gradients are ready)."""
    exposed = dict(busy)
    runner = framework(lever.framework)
    backward = compute * 2 / 3  # backward is ~2/3 of a step's FLOPs
    if runner.tp_overlap and "tp" in busy:  # run under the matmuls that feed them
        exposed["tp"] = max(0.0, busy["tp"] - compute)
    for dim in ("dp", "fsdp"):
        if dim not in busy:
            continue
        kinds = [k for (d, k) in costs.comm if d == dim and k != "all_to_all"]
        calls = sum(costs.comm[(dim, k)][0] for k in kinds)
        late = busy[dim] - critical.get(dim, 0.0)
        if (not runner.dp_overlap or layout.data_engine == "naive"
                or cluster.gpu.measured):
            # reduced after backward, whole; or this machine: a CPU rank's collectives run
            # on gloo's threads, on the one core its compute has (no copy engine, no second
            # stream): labkit's own split measures them exposed whole (comm_s =
            # comm_busy_s under FSDP and DDP)
            calls = calls if runner.dp_overlap else 1
            exposed[dim] = critical.get(dim, 0.0) + max(late, late / max(calls, 1))
            continue
        shared = compute if (dim, "all_gather") in costs.comm else backward
        each = 0.0
        for kind in kinds:
            t = by_kind[(dim, kind)]
            if (dim, kind) == ("fsdp", "all_gather"):
                t -= critical.get(dim, 0.0) if runner.backward_prefetch == "post" else 0.0
            each += max(0.0, t - hiding_window_s(dim, kind, lever, compute, layout.pp > 1))
        exposed[dim] = critical.get(dim, 0.0) + max(each, late - shared,
                                                    late / max(calls, 1))
    return exposed
