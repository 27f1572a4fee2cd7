"""Benchmark: ring attention against whole-sequence attention, and expert parallelism's step
and all-to-all bytes against the formula.

    python bench/long_context.py          # sequences up to 4096 tokens, 8 timed repeats
    python bench/long_context.py --quick  # about a minute

1. Attention by sequence length (batch 1, 4 heads of 32): forward + backward of
   ``F.scaled_dot_product_attention`` on one rank; labkit's blockwise attention on one rank
   (the ring of one: the same arithmetic as the ring, whole sequence); ring attention on 2
   ranks. Peak memory per rank by labkit's tracker (tensors; a kernel's own workspace, such
   as SDPA's on CPU, is not a tensor and is not counted, so SDPA's peak reads low); time the
   median of the repeats, of the slowest rank.
2. Expert parallelism: the MoE GPT trained on one device, on 2 ranks with experts replicated
   (DDP) and on 2 ranks with experts split (``Layout(dp=2, ep=2)``): median step time,
   parameters per rank, all-to-all bytes counted vs ``costs.moe_all_to_all_bytes``, and the
   dense GPT's and the MoE's forward FLOPs per token (``FlopCounterMode``).
The machine is shared: times are measured side by side in one run; read their ratios.
The last line printed is one JSON object of the figures.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

import labkit
from labkit.lessons.long_context.compare import forward_flops_per_token
from labkit.models import GPTConfig, MoEGPTConfig, count_parameters
from labkit.runtime.costs import moe_all_to_all_bytes
from labkit.training.layout import Layout


def _attention_on_rank(ctx, seq_len: int, kind: str, repeats: int) -> dict:
    import time

    import torch.distributed as dist
    import torch.nn.functional as F

    from labkit.parallel.context import ring_attention, shard_sequence

    gen = torch.Generator().manual_seed(0)
    whole = [torch.randn(1, 4, seq_len, 32, generator=gen) for _ in range(3)]
    mine = [shard_sequence(t, ctx.rank, ctx.world_size, dim=2) for t in whole]
    times, peak = [], 0
    for _ in range(repeats):
        q, k, v = (t.clone().requires_grad_() for t in mine)
        with ctx.memory as tracker:
            tracker.reset_peak()
            start = time.perf_counter()
            if kind == "sdpa":
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                out = ring_attention(q, k, v, dist.group.WORLD, causal=True)
            out.sum().backward()
            times.append(time.perf_counter() - start)
            peak = max(peak, tracker.report()["peak_bytes"])
        del out, q, k, v
    return {"seconds": statistics.median(times), "peak_bytes": peak}


def attention(cluster, seqs: list[int], repeats: int) -> list[dict]:
    rows = []
    for seq in seqs:
        row = {"seq_len": seq}
        for name, ranks, kind in (("sdpa_1", 1, "sdpa"), ("blockwise_1", 1, "ring"),
                                  ("ring_2", 2, "ring")):
            with cluster.resized(ranks):
                out = cluster.run(_attention_on_rank, seq, kind, repeats)
            row[name] = {"ms": round(1e3 * max(o["seconds"] for o in out), 2),
                         "peak_mib": round(max(o["peak_bytes"] for o in out) / 2**20, 3)}
        row["ring_2_time_vs_blockwise_1"] = round(row["ring_2"]["ms"] / row["blockwise_1"]["ms"], 3)
        row["ring_2_peak_vs_blockwise_1"] = round(row["ring_2"]["peak_mib"] /
                                                  row["blockwise_1"]["peak_mib"], 3)
        print(json.dumps(row))
        rows.append(row)
    return rows


def experts(cluster, steps: int) -> dict:
    moe = MoEGPTConfig(vocab_size=128, seq_len=64, d_model=64, n_heads=4, n_layers=2,
                       n_experts=4, top_k=2, capacity_factor=1.25)
    dense = GPTConfig(vocab_size=128, seq_len=64, d_model=64, n_heads=4, n_layers=2)
    config = labkit.TrainConfig(model=moe, global_batch=8, steps=steps, optimizer="sgd")
    out = {"params_dense": count_parameters(dense), "params_moe": count_parameters(moe),
           "flops_per_token_dense": forward_flops_per_token(dense),
           "flops_per_token_moe": forward_flops_per_token(moe)}
    # twice the experts, the same top_k: parameters grow, FLOPs per token do not (the
    # experts' slots, n_experts x capacity, stay capacity_factor x seq x top_k)
    wide = MoEGPTConfig(**{**moe.__dict__, "n_experts": 8})
    out.update(params_moe_8_experts=count_parameters(wide),
               flops_per_token_moe_8_experts=forward_flops_per_token(wide))
    runs = {"one device": (1, Layout()), "dp2 (experts replicated)": (2, Layout(dp=2)),
            "dp2 ep2 (experts split)": (2, Layout(dp=2, ep=2))}
    for name, (ranks, layout) in runs.items():
        with cluster.resized(ranks):
            report = labkit.train(cluster, config.replace(layout=layout))
        split = report.split()
        row = {"median_step_ms": round(1e3 * split["step_s"], 2),
               "comm_ms": round(1e3 * split.get("comm_s", 0.0), 2),
               "peak_mib": round(max(report.peak_bytes) / 2**20, 3)}
        moved = report.comm_by_dim().get("dp", {}).get("all_to_all")
        if moved:
            batch = config.global_batch // layout.dp
            row["all_to_all_bytes"] = moved["bytes"]
            row["all_to_all_formula"] = moe_all_to_all_bytes(moe.n_layers, moe.n_experts, batch,
                                                             moe.capacity(), moe.d_model)
        out[name] = row
        print(json.dumps({name: row}))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="about a minute")
    args = parser.parse_args()
    seqs = [256, 512, 1024] if args.quick else [256, 512, 1024, 2048, 4096]
    repeats, steps = (3, 6) if args.quick else (8, 12)
    with labkit.Cluster(2, device="cpu", progress=False) as cluster:
        figures = {"attention": attention(cluster, seqs, repeats),
                   "experts": experts(cluster, steps)}
    figures["machine"] = "shared 2-core CPU machine, gloo ranks, one core each"
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
