"""Ring attention (labkit/parallel/context) against PyTorch's attention on the whole
sequence: outputs and gradients, causal and not, on 2 and 4 CPU ranks; the online softmax's
merge on its own; PyTorch's context_parallel engine against ours on a GPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import labkit
from labkit.parallel.context import (
    block_forward,
    merge,
    positions,
    shard_sequence,
    unshard_sequence,
)


def _against_sdpa(ctx, causal: bool, seq_len: int = 16):
    """Max |ring - whole-sequence SDPA| of this rank's output and its q, k, v gradients."""
    import torch.distributed as dist

    from labkit.parallel.context import ring_attention, shard_sequence

    gen = torch.Generator().manual_seed(7)
    q, k, v, grad = (torch.randn(2, 3, seq_len, 8, generator=gen, dtype=torch.float64)
                     for _ in range(4))
    whole = [t.clone().requires_grad_() for t in (q, k, v)]
    expected = F.scaled_dot_product_attention(*whole, is_causal=causal)
    expected.backward(grad)
    mine = [shard_sequence(t, ctx.rank, ctx.world_size, dim=2).requires_grad_()
            for t in (q, k, v)]
    out = ring_attention(*mine, group=dist.group.WORLD, causal=causal)
    out.backward(shard_sequence(grad, ctx.rank, ctx.world_size, dim=2))
    errors = {"out": (out - shard_sequence(expected, ctx.rank, ctx.world_size, 2)).abs().max()}
    for name, local, ref in zip("qkv", mine, whole, strict=True):
        want = shard_sequence(ref.grad, ctx.rank, ctx.world_size, dim=2)
        errors["d" + name] = (local.grad - want).abs().max()
    return {key: value.item() for key, value in errors.items()}


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("ranks", [2, 4])
def test_ring_attention_equals_sdpa_on_the_whole_sequence(two, four, ranks, causal):
    cluster = two if ranks == 2 else four
    for rank, errors in enumerate(cluster.run(_against_sdpa, causal)):
        assert max(errors.values()) < 1e-12, (rank, errors)


def test_merge_of_two_key_blocks_is_attention_over_both():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 6, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    left = block_forward(q, k[:, :, :4], v[:, :, :4], "full")
    right = block_forward(q, k[:, :, 4:], v[:, :, 4:], "full")
    out, _ = merge(*left, *right)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v))


@pytest.mark.parametrize("kind", ["full", "diagonal"])
def test_query_tiles_change_nothing(kind):
    from labkit.parallel.context import block_backward

    gen = torch.Generator().manual_seed(1)
    q, k, v, grad = (torch.randn(1, 2, 10, 4, generator=gen, dtype=torch.float64)
                     for _ in range(4))
    whole_out, whole_lse = block_forward(q, k, v, kind, tile=10)
    out, lse = block_forward(q, k, v, kind, tile=3)
    torch.testing.assert_close((out, lse), (whole_out, whole_lse))
    delta = (grad * out).sum(-1)
    torch.testing.assert_close(block_backward(q, k, v, kind, lse, grad, delta, tile=3),
                               block_backward(q, k, v, kind, lse, grad, delta, tile=10))


def test_load_balanced_shards_cover_the_sequence_once():
    assert positions(0, 2, 8).tolist() == [0, 1, 6, 7]
    assert positions(1, 2, 8).tolist() == [2, 3, 4, 5]
    tokens = torch.arange(24).view(1, 24)
    pieces = [shard_sequence(tokens, r, 3) for r in range(3)]
    assert torch.equal(unshard_sequence(pieces), tokens)
    with pytest.raises(ValueError, match="multiple of 6"):
        positions(0, 3, 16)


def _against_torch_engine(ctx, seq_len: int = 32):
    """This rank's max |ours - PyTorch's context_parallel| and |PyTorch's - whole SDPA|,
    whole sequences gathered from both (PyTorch shards the buffers in its own order)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import context_parallel_unshard

    from labkit.parallel.context import ring_attention, shard_sequence, unshard_sequence

    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 4, seq_len, 64, generator=gen).to(ctx.device) for _ in range(3))
    whole = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    theirs_q, theirs_k, theirs_v = q.clone(), k.clone(), v.clone()
    with context_parallel(mesh, buffers=[theirs_q, theirs_k, theirs_v],
                          buffer_seq_dims=[2, 2, 2]):
        theirs = F.scaled_dot_product_attention(theirs_q, theirs_k, theirs_v, is_causal=True)
    (theirs,) = context_parallel_unshard(mesh, [theirs], [2])
    mine = ring_attention(*(shard_sequence(t, ctx.rank, ctx.world_size, 2) for t in (q, k, v)))
    pieces = [torch.empty_like(mine) for _ in range(ctx.world_size)]
    dist.all_gather(pieces, mine.contiguous())
    ours = unshard_sequence(pieces, dim=2)
    return {"ours_vs_torch": (ours - theirs).abs().max().item(),
            "torch_vs_whole": (theirs - whole).abs().max().item()}


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs (ranks sharing "
                    "one GPU talk over gloo, which cannot send GPU tensors point to point)")
def test_ring_attention_equals_torch_context_parallel_on_gpus():
    """On GPUs PyTorch's own engine runs (on CPU it refuses: no sharding strategy for
    aten._scaled_dot_product_flash_attention_for_cpu), and ours equals it."""
    ranks = 2
    with labkit.Cluster(ranks, device="cuda", progress=False,
                        memory_per_device="2GiB") as cluster:
        for rank, errors in enumerate(cluster.run(_against_torch_engine)):
            assert errors["ours_vs_torch"] < 1e-4 and errors["torch_vs_whole"] < 1e-4, \
                (rank, errors)


def _observed_against_plain(ctx) -> dict:
    import torch.distributed as dist

    from labkit.parallel.context import ring_forward
    from labkit.parallel.context.observe import observed_ring_forward

    gen = torch.Generator().manual_seed(3)
    q, k, v = (shard_sequence(torch.randn(1, 2, 16, 8, generator=gen), ctx.rank,
                              ctx.world_size, dim=2) for _ in range(3))
    plain = ring_forward(q, k, v, dist.group.WORLD, True)
    schedule: list = []
    observed = observed_ring_forward(q, k, v, dist.group.WORLD, True, schedule=schedule)
    doubled = observed_ring_forward(q, k, v, dist.group.WORLD, True,
                                    merge_fn=lambda *args: (merge(*args)[0] * 2, merge(*args)[1]))
    return {"equal": all(torch.equal(a, b) for a, b in zip(plain, observed, strict=True)),
            "steps": [(step, source) for step, source, _ in schedule],
            "merge_used": not torch.equal(doubled[0], plain[0])}


def test_the_observed_ring_runs_ring_forwards_own_code(two):
    """ring_forward is the algorithm alone; the lesson's wrapper notes its steps and swaps
    its merge, giving the same numbers when nothing is swapped."""
    import inspect

    from labkit.parallel.context import ring_forward

    assert list(inspect.signature(ring_forward).parameters) == ["q", "k", "v", "group",
                                                                "causal"]
    for rank, result in enumerate(two.run(_observed_against_plain)):
        assert result["equal"] and result["merge_used"]
        assert result["steps"] == [(0, rank), (1, 1 - rank)]


def test_the_observed_ring_refuses_a_wrapped_ring_forward(monkeypatch):
    """A decorated or patched ring_forward calls the original from its own code, which the
    swap of names would miss (an empty schedule, labkit's merge): refused, not run."""
    import functools

    from labkit.parallel.context import observe, ring

    original = ring.ring_forward

    @functools.wraps(original)
    def wrapped(*args):
        return original(*args)

    monkeypatch.setattr(ring, "ring_forward", wrapped)
    with pytest.raises(RuntimeError, match="renamed, or wrapped"):
        observe.observed_ring_forward(None, None, None, None, True, schedule=[])
