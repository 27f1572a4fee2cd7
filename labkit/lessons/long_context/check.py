"""Check for notebook 08's exercise: the online softmax's merge of two partial attentions.

The learner writes ``merge_attention(out_a, lse_a, out_b, lse_b) -> (out, lse)``: the
attention of the same queries over keys A and over keys B, each kept as its output
(batch, heads, queries, d_head) and the log of its softmax denominator (batch, heads,
queries), merged into the attention over A and B. Every rank runs ring attention with the
learner's merge in place of labkit's, on the causal split of notebook 08, and compares its
tokens' output with ``F.scaled_dot_product_attention`` on the whole sequence, computed by the
check outside the ranks on inputs from a seed drawn for each run: once at
ordinary scores, once with scores in the hundreds (where exp() overflows float32 unless the
merge works in log space), and with -inf for "no keys yet" (the ring's start).
"""

from __future__ import annotations

from labkit.lessons.exercise.outside import fresh_seed
from labkit.lessons.exercise.result import CheckResult, failed, passed
from labkit.lessons.exercise.runner import at_two_sizes, run_checked

EXERCISE = "merge_attention"
WHERE = "merge_attention(out_a, lse_a, out_b, lse_b)"
HINT = ("lse = log(exp(lse_a) + exp(lse_b)) computed stably (torch.logaddexp); each output "
        "weighs by exp(its lse - lse): the share of the softmax's denominator its keys hold")
CASES = {"ordinary scores": 1.0, "scores in the hundreds": 60.0}
SEQ_LEN = 16


def _returns_a_pair(fn):
    """``fn`` whose result must be the pair (out, lse): a single tensor would otherwise be
    unpacked along its batch dimension and fail far from the learner's code."""

    def merge(out_a, lse_a, out_b, lse_b):
        result = fn(out_a, lse_a, out_b, lse_b)
        if not isinstance(result, (tuple, list)) or len(result) != 2:
            raise TypeError(f"{WHERE} returned {type(result).__name__}"
                            f"{f' of {len(result)}' if isinstance(result, (tuple, list)) else ''}"
                            ": return the pair (out, lse), e.g. `return out, lse`")
        return tuple(result)

    return merge


def _inputs(seed: int, scale: float, seq_len: int):
    """q, k, v of shape (batch 1, heads 2, seq_len, d_head 8); q scaled (large scores: exp()
    of them overflows float32)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 2, seq_len, 8, generator=gen) for _ in range(3))
    return q * scale, k, v


def _on_rank(ctx, fn, seed: int, seq_len: int = SEQ_LEN):
    import torch.distributed as dist

    from labkit.parallel.context import shard_sequence
    from labkit.parallel.context.observe import observed_ring_forward

    out = {}
    for case, scale in CASES.items():
        q, k, v = (t.to(ctx.device) for t in _inputs(seed, scale, seq_len))
        mine = [shard_sequence(t, ctx.rank, ctx.world_size, dim=2) for t in (q, k, v)]
        got, _ = observed_ring_forward(*mine, dist.group.WORLD, True,
                                       merge_fn=_returns_a_pair(fn))
        out[case] = got.detach().cpu()
    return out


def _compared(values, seed: int, world_size: int) -> list[dict]:
    """Per rank, per case: each rank's tokens of the output beside the whole sequence's
    attention, computed here (never on the ranks, where the learner's code runs)."""
    import torch
    import torch.nn.functional as F

    from labkit.parallel.context import shard_sequence

    compared = [{} for _ in values]
    for case, scale in CASES.items():
        whole = F.scaled_dot_product_attention(*_inputs(seed, scale, SEQ_LEN), is_causal=True)
        for rank, result in enumerate(values):
            got = result.get(case) if isinstance(result, dict) else None
            want = shard_sequence(whole, rank, world_size, dim=2)
            if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(want.shape):
                shape = list(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
                compared[rank][case] = {"shape": shape, "want_shape": list(want.shape)}
                continue
            finite = bool(torch.isfinite(got).all())
            error = (got - want).abs().max().item() if finite else float("inf")
            compared[rank][case] = {"finite": finite, "error": error}
    return compared


def _judge(values, world_size: int) -> CheckResult:
    for case in CASES:
        for rank, result in enumerate(values):
            got = result[case]
            if "shape" in got:
                return failed(EXERCISE, f"with {case}, rank {rank}'s attention came out with "
                              f"shape {got['shape']}, not {got['want_shape']}: return out "
                              "shaped like out_a and lse like lse_a", [HINT])
            if not got["finite"]:
                return failed(EXERCISE, f"with {case}, rank {rank}'s attention holds inf or "
                              "NaN: exp() of a large log-sum-exp overflows (or -inf - -inf "
                              "at the ring's start); combine in log space", [HINT])
            if got["error"] > 1e-4:
                return failed(EXERCISE, f"with {case}, rank {rank}'s attention differs from "
                              f"the whole sequence's by up to {got['error']:.3g}", [HINT],
                              case=case, rank=rank, error=got["error"])
    worst = max(r[c]["error"] for r in values for c in CASES)
    return passed(EXERCISE, f"ring attention with your merge equals attention on the whole "
                  f"sequence on {world_size} ranks (largest difference {worst:.2g})",
                  [f"{case}: checked" for case in CASES])


def merge_attention(cluster, fn, timeout: float | None = None) -> CheckResult:
    """Run ring attention with ``fn`` as its merge on every rank; then at a second size."""

    def once() -> CheckResult:
        seed = fresh_seed()  # the same for every rank: each needs the whole q, k and v
        outcome = run_checked(cluster, EXERCISE, WHERE, _on_rank, fn, seed, timeout=timeout)
        if outcome.verdict:
            return outcome.verdict
        n = cluster.world_size
        return _judge(_compared(outcome.values, seed, n), n)

    return at_two_sizes(cluster, once)
