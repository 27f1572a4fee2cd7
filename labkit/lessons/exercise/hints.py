"""One hint per exercise, shown under a failed check: the idea that unblocks most learners,
without the code. The reference solution itself is one call away (``labkit.check.reveal``)."""

from __future__ import annotations

HINTS = {
    "ring_all_reduce": (
        "At reduce-scatter step s, rank r sends chunk (r - s) mod N to the right and adds what "
        "arrives from the left into chunk (r - s - 1) mod N. Rank r then holds the complete "
        "chunk (r + 1) mod N: at all-gather step s it sends chunk (r + 1 - s) mod N and copies "
        "what arrives (no adding) into chunk (r - s) mod N. Start each send with dist.isend, "
        "then dist.recv, then wait on the send: if every rank calls the blocking dist.send "
        "first, none is receiving."),
    "predict_memory": (
        "Count the parameters layer by layer (weights and biases), then: parameters and "
        "gradients 4 bytes each per parameter in float32, Adam keeps two more numbers per "
        "parameter (8 bytes). Activations alive after the loss: the input, every hidden "
        "layer's output, the model's output and the targets, batch x width numbers each."),
    "average_gradients": (
        "dist.all_reduce sums a tensor over the ranks in place. Apply it to every parameter's "
        ".grad, then divide by ctx.world_size: the whole batch's gradient is the mean of the "
        "slices' gradients."),
    "bucket_hook": (
        "Divide bucket.buffer() by the world size, start one dist.all_reduce on it with "
        "async_op=True, and return work.get_future().then(...) whose callback returns the "
        "reduced tensor (future.value()[0])."),
    "pipeline_step": (
        "Rank 0 runs every micro-batch forward and sends each output (detached); rank 1 "
        "receives each into a tensor that requires grad, computes its loss divided by the "
        "number of micro-batches, then backward on each and sends the input's .grad back; rank "
        "0 receives those gradients and calls backward on its kept outputs with them."),
    "tensor_parallel_linears": (
        "A column-parallel layer keeps rows [rank] of weight.chunk(N, dim=0) and of the bias, "
        "and wraps its input in copy_to_parallel_region (identity forward, all-reduce "
        "backward). A row-parallel layer keeps weight.chunk(N, dim=1)[rank], sums the partial "
        "outputs with reduce_from_parallel_region, and adds the whole bias once, after the "
        "sum."),
    "tensor_parallel_plan": (
        "Print the block to see its modules' names. Each pair of linear layers is split the "
        "Megatron way: the first by columns (ColwiseParallel(): attention's fused qkv, whose "
        "columns are the heads, and the MLP's first linear), the second by rows "
        "(RowwiseParallel(): attention's output projection and the MLP's last linear). The "
        "norms, GELU and the residual adds stay out of the plan."),
    "zero1": (
        "Give each parameter one owner rank (balance the numbers each rank owns), build a "
        "torch Adam over this rank's parameters only, and after its step broadcast every "
        "parameter from its owner, so that every rank holds every updated weight."),
    "fully_shard_model": (
        "A unit is what FSDP gathers whole at once. Loop over model.blocks and call "
        "fully_shard(block, mesh=mesh) on each, then fully_shard(model, mesh=mesh) once, last: "
        "the root takes the parameters that no block took (embeddings, final norm, head)."),
    "place_tables": (
        "Greedy works: take the tables from largest to smallest and put each on the rank that "
        "holds the fewest bytes so far. Check that no rank ends above the capacity."),
    "mesh_groups": (
        "Ranks are numbered with the last dimension (tp) varying fastest. The stride of a "
        "dimension is the product of the degrees after it; a group is a first member and the "
        "ranks stride, 2 x stride, ... after it, degree members in all."),
    "merge_attention": (
        "Work in log space: the merged log-sum-exp is torch.logaddexp(lse_a, lse_b), and each "
        "partial output is weighted by exp(its lse - the merged lse) (unsqueeze(-1) the weight, "
        "shaped like lse, to broadcast over the output's last dimension, d_head)."),
    "all_reduce_seconds": (
        "A ring AllReduce takes 2(N-1) steps (N-1 to reduce-scatter, N-1 to all-gather), each "
        "paying the start-up cost alpha, and sends 2(N-1)/N of the message per rank at the "
        "bandwidth; one rank communicates nothing."),
    "training_state": (
        "state_dict returns a dict of the model's and optimizer's state (get_state_dict gives "
        "both) and the step; load_state_dict puts them back with set_state_dict and restores "
        "the step."),
    "pipeline_schedule": (
        "Each rank builds PipelineStage(part, stage_index=ctx.rank, num_stages=ctx.world_size, "
        "device=ctx.device), then ScheduleGPipe(stage, n_microbatches=micro_batches, "
        "loss_fn=loss_fn) on every rank: a schedule without a loss_fn runs no backward."),
    "dcp_resume": (
        "Save {\"model\": ..., \"optimizer\": ..., \"step\": step} from get_state_dict(model, "
        "optimizer) with dcp.save(state, checkpoint_id=folder). To load, build the same dict "
        "from the fresh model and optimizer, dcp.load it (in place), put it back with "
        "set_state_dict and return its step."),
    "compose_mesh": (
        "init_device_mesh(ctx.device.type, (dp, tp), mesh_dim_names=(\"dp\", \"tp\")); "
        "parallelize_module(model, mesh[\"tp\"], tp_plan) first, then fully_shard(model, "
        "mesh=mesh[\"dp\"]); return the mesh."),
}


def hint(exercise: str) -> str:
    """The hint for ``exercise`` ("" for an exercise without one)."""
    return HINTS.get(exercise, "")
