"""Check for notebook 08's exercise: the online softmax's merge of two partial attentions.

The learner writes ``merge_attention(out_a, lse_a, out_b, lse_b) -> (out, lse)``: the
attention of the same queries over keys A and over keys B, each kept as its output
(batch, heads, queries, d_head) and the log of its softmax denominator (batch, heads,
queries), merged into the attention over A and B. Every rank runs ring attention with the
learner's merge in place of labkit's, on the causal split of notebook 08, and compares its
tokens' output with ``F.scaled_dot_product_attention`` on the whole sequence: once at
ordinary scores, once with scores in the hundreds (where exp() overflows float32 unless the
merge works in log space), and with -inf for "no keys yet" (the ring's start).
"""

from __future__ import annotations

from labkit.lessons.exercise.result import CheckResult, failed, passed
from labkit.lessons.exercise.runner import at_two_sizes, run_checked

EXERCISE = "merge_attention"
WHERE = "merge_attention(out_a, lse_a, out_b, lse_b)"
HINT = ("lse = log(exp(lse_a) + exp(lse_b)) computed stably (torch.logaddexp); each output "
        "weighs by exp(its lse - lse): the share of the softmax's denominator its keys hold")
CASES = {"ordinary scores": 1.0, "scores in the hundreds": 60.0}


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


def _on_rank(ctx, fn, seq_len: int = 16):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from labkit.parallel.context import ring_forward, shard_sequence

    out = {}
    for case, scale in CASES.items():
        gen = torch.Generator().manual_seed(11)
        q, k, v = (torch.randn(1, 2, seq_len, 8, generator=gen) for _ in range(3))
        q = q * scale  # large scores: exp() of them overflows float32
        whole = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        mine = [shard_sequence(t, ctx.rank, ctx.world_size, dim=2) for t in (q, k, v)]
        got, _ = ring_forward(*mine, dist.group.WORLD, True, merge_fn=_returns_a_pair(fn))
        want = shard_sequence(whole, ctx.rank, ctx.world_size, dim=2)
        if tuple(got.shape) != tuple(want.shape):
            out[case] = {"shape": list(got.shape), "want_shape": list(want.shape)}
            continue
        finite = bool(torch.isfinite(got).all())
        error = (got - want).abs().max().item() if finite else float("inf")
        out[case] = {"finite": finite, "error": error}
    return out


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
        outcome = run_checked(cluster, EXERCISE, WHERE, _on_rank, fn, timeout=timeout)
        return outcome.verdict or _judge(outcome.values, cluster.world_size)

    return at_two_sizes(cluster, once)
