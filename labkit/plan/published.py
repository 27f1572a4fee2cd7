"""Published large-scale trainings, rebuilt with labkit's decoder (GPT blocks, or Llama blocks
from ``labkit.models.presets``) at the published shape, layout, batch and precision, and
projected beside the figure their authors published
(``python bench/published.py`` prints them all; notebook 09 shows four).

Each run names its source, the published figure in the source's own unit, how a projected
step becomes that unit, and every assumption the rebuild makes where the source is silent or
labkit cannot express the run exactly. Facts only: the figures are read from the papers and
documentation named (read 2026-12-01).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from labkit.models import LLAMA3_8B, GPTConfig
from labkit.plan.parallelism import Parallelism

NARAYANAN = ("Narayanan et al. 2021, 'Efficient Large-Scale Language Model Training on GPU "
             "Clusters Using Megatron-LM', Table 1 (weak scaling, A100 80GB, Selene)")
KORTHIKANTI = ("Korthikanti et al. 2022, 'Reducing Activation Recomputation in Large "
               "Transformer Models', Table 5 (end-to-end iteration time)")
BLOOM = ("BigScience 2022, BLOOM 176B model card and 'The BigScience 176B Model' page "
         "(bigscience.notion.site): 384 A100 80GB, 'about 150 TFLOPs' per GPU")
TITAN = ("torchtitan docs/performance.md (2024-12, Grand Teton: H100 96GB HBM2e at 500 W), "
         "Tables 1 and 3 (FSDP, no torch.compile, no Float8)")
LLAMA3 = "Dubey et al. 2024, 'The Llama 3 Herd of Models', Table 4"
MCORE = ("NVIDIA/Megatron-LM README.md, 'Training Speed and Scalability' and its table "
         "images/model_table.png (commit f2e5db402c, 2024-07-15: weak scaling, H100 GPUs)")
OPT = ("Zhang et al. 2022, 'OPT: Open Pre-trained Transformer Language Models', section 2.4 "
       "and Table 1 (992 A100 80GB: 'utilization of up to 147 TFLOP/s per GPU'); the recipe "
       "from metaseq's launcher (metaseq/launcher/opt_baselines.py, opt_job_constants.py at "
       "f7ffa5f) and the 175B logbook notes (projects/OPT/chronicles/10_percent_update.md: "
       "'8x Tensor Parallelism', 'Batch-size of 2M')")
FOUNDRY = ("MosaicML llm-foundry scripts/train/benchmarking/README.md, 'H100 80GB BF16' "
           "(MPT models, Composer FSDP FULL_SHARD, amp_bf16)")

MEGATRON_TFLOPS = "TFLOP/s per GPU (Megatron's formula, recomputation counted)"
SECONDS = "s per iteration"
TOKENS = "tokens/s per GPU"
COUNTED_TFLOPS = "TFLOP/s per GPU (model FLOPs, labkit's count)"
MCORE_TFLOPS = "TFLOP/s per GPU (Megatron-Core's formula, no recomputation)"

# Megatron 2021/2022 runs: what every row of those tables shares
MEGATRON_2021 = ("vocabulary 51,200 and sequence 2,048 (the paper's section 5.1)",
                 "fp16 mixed precision with dynamic loss scaling (precision 'fp16': the "
                 "state of Megatron's mixed precision, the gradients unscaled once a step)",
                 "no flash attention (2021: fused softmax over the full seq x seq scores)",
                 "micro-batch size 1, the rest of a replica's batch accumulated (the table "
                 "does not say; the paper's section 3.3 recommends small micro-batches)",
                 "1F1B without interleaving (the table does not say which rows interleave)")


@dataclass(frozen=True)
class Run:
    """One published training and how to rebuild it."""

    name: str
    source: str
    model: GPTConfig
    layout: Parallelism
    gpu: str
    global_batch: int
    micro_batches: int
    unit: str
    published: float
    levers: dict = field(default_factory=dict)
    assumptions: tuple[str, ...] = ()
    cluster: dict = field(default_factory=dict)


def megatron_flops(model: GPTConfig, batch: int) -> float:
    """Narayanan et al. 2021, eq. 3: FLOPs of one iteration with full recomputation,
    96 B s l h^2 (1 + s / 6h + V / 16 l h)."""
    b, s, layers, h, v = batch, model.seq_len, model.n_layers, model.d_model, model.vocab_size
    return 96 * b * s * layers * h * h * (1 + s / (6 * h) + v / (16 * layers * h))


def megatron_core_flops(model: GPTConfig, batch: int) -> float:
    """Megatron-LM's ``num_floating_point_operations`` (megatron/training/training.py at
    f2e5db402c) for a GPT block (no GQA, ffn 4h, no SwiGLU, no MoE):
    12 B s l h^2 ((2 + s/h) + 4 + V / 2lh)."""
    b, s, layers, h, v = batch, model.seq_len, model.n_layers, model.d_model, model.vocab_size
    return 12 * b * s * layers * h * h * ((2 + s / h) + 4 + v / (2 * layers * h))


def gpt(d_model: int, heads: int, layers: int, vocab: int = 51200, seq: int = 2048):
    return GPTConfig(vocab_size=vocab, seq_len=seq, d_model=d_model, n_heads=heads,
                     n_layers=layers)


def _narayanan() -> list[Run]:
    # (billions, heads, hidden, layers, tp, pp, GPUs, batch, TFLOP/s per GPU)
    rows = ((1.7, 24, 2304, 24, 1, 1, 32, 512, 137), (3.6, 32, 3072, 30, 2, 1, 64, 512, 138),
            (7.5, 32, 4096, 36, 4, 1, 128, 512, 142), (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
            (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138),
            (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140),
            (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148),
            (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
            (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163),
            (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163))
    runs = []
    for billions, heads, hidden, layers, tp, pp, gpus, batch, tflops in rows:
        dp = gpus // (tp * pp)
        micro = batch // dp  # micro-batch size 1
        runs.append(Run(
            f"megatron21_{billions:g}B", NARAYANAN, gpt(hidden, heads, layers),
            Parallelism.of(dp=dp, tp=tp, pp=pp, schedule="1f1b" if pp > 1 else None), "A100-80GB",
            batch, micro, MEGATRON_TFLOPS, tflops,
            dict(activation_checkpointing=True, flash_attention=False,
                 framework="megatron-2021", precision="fp16"),
            MEGATRON_2021 + ("full activation recomputation (the formula's 4 forward passes)",)))
    return runs


def _korthikanti() -> list[Run]:
    # (name, heads, hidden, layers, tp, pp, GPUs, batch, s full recompute, s present work)
    rows = (("22B", 64, 6144, 48, 8, 1, 8, 4, 1.42, 1.10),
            ("175B", 96, 12288, 96, 8, 8, 64, 64, 18.13, 13.75),
            ("530B", 128, 20480, 105, 8, 35, 280, 280, 49.05, 37.83),
            ("1T", 160, 25600, 128, 8, 64, 512, 512, 94.42, 71.49))
    runs = []
    for name, heads, hidden, layers, tp, pp, gpus, batch, full, present in rows:
        dp = gpus // (tp * pp)
        micro = batch // dp  # micro-batch size 1
        layout = Parallelism.of(dp=dp, tp=tp, pp=pp, schedule="1f1b" if pp > 1 else None)
        common = MEGATRON_2021[:4] + ("1F1B; the 530B and 1T interleave in the paper's "
                                      "section 6 (not said for Table 5): taken as plain",)
        runs.append(Run(f"korthikanti22_{name}_full", KORTHIKANTI, gpt(hidden, heads, layers),
                        layout, "A100-80GB", batch, micro, SECONDS, full,
                        dict(activation_checkpointing=True, flash_attention=False,
                             framework="megatron-2021", precision="fp16"),
                        common + ("full recomputation, no sequence parallelism",)))
        runs.append(Run(f"korthikanti22_{name}_sp_sel", KORTHIKANTI,
                        gpt(hidden, heads, layers), layout, "A100-80GB", batch, micro, SECONDS,
                        present,
                        dict(selective_recompute=True, sequence_parallel=True,
                             flash_attention=False, framework="megatron-2021",
                             precision="fp16"),
                        common + ("sequence parallelism and selective recomputation (the "
                                  "attention core recomputed), the paper's 'present work'",)))
    return runs


def _bloom() -> Run:
    return Run(
        "bloom_176B", BLOOM, gpt(14336, 112, 70, vocab=250880),
        Parallelism.of(dp=8, tp=4, pp=12, schedule="1f1b"), "A100-80GB", 2048, 2048 // 8 // 2,
        MEGATRON_TFLOPS, 150.0,
        dict(activation_checkpointing=True, flash_attention=False, zero_stage=1,
             framework="megatron-deepspeed"),
        ("micro-batch size 2 (the tr11 training script)", "bf16 mixed precision, ZeRO-1 over "
         "dp (DeepSpeed): optimizer state sharded 8 ways",
         "ALiBi and the embedding LayerNorm left out (no parameters to speak of)",
         "full activation recomputation; no flash attention (2022); Megatron's default "
         "attention dropout (the script is taken not to override it)",
         "DeepSpeed's pipeline engine: whole activations between stages, gradients reduced "
         "after the last micro-batch",
         "Jean Zay's network: 4 x 100 Gb/s Omni-Path per node of 8 GPUs",
         "the published figure is 'about 150': Megatron-DeepSpeed's formula with recompute"),
        cluster=dict(network_gbps=4 * 100 / 8))


def _opt() -> Run:
    model = dataclasses.replace(gpt(12288, 96, 96, vocab=50272), tie_embeddings=True)
    return Run(
        "opt_175B", OPT, model, Parallelism.of(fsdp=124, tp=8, dp_kind="fsdp"), "A100-80GB",
        992, 1, MEGATRON_TFLOPS, 147.0,
        dict(activation_checkpointing=True, flash_attention=False, framework="metaseq",
             precision="fp16"),
        ("GPT blocks, 96 layers of width 12,288 and 96 heads (Table 1), sequence 2,048, "
         "vocabulary 50,272 (the released checkpoints': GPT-2's 50,257 BPE tokens and "
         "metaseq's specials, padded to a multiple of 8), embeddings tied "
         "(--share-decoder-input-output-embed), learned positions, LayerNorm and biases; "
         "ReLU for GeLU (the same FLOPs to speak of)",
         "tensor parallelism 8 inside each node, FSDP over the 124 nodes (992 GPUs)",
         "batch 2M tokens as the launcher splits it (opt_job_constants.py: 175b at 2.0 x "
         "2^20 tokens): 2^21 // 124 ranks // 2,048 = 8 sequences a data-parallel rank, 992 "
         "in all, --update-freq 1: one micro-batch",
         "the launcher's flags taken for the 175B run: --memory-efficient-fp16, "
         "fully-sharded data parallel without resharding after forward, full activation "
         "checkpointing distributed over the tp ranks, dropout and attention dropout 0.1, no "
         "fused attention (2021)",
         "the network: 200 Gb/s HDR InfiniBand per GPU, as on Azure's ND A100 v4 (metaseq's "
         "data lives on Azure, DATA_LOCATIONS; the paper does not name the cluster)",
         "the figure's formula is not stated: Megatron's with recomputation counted; the "
         "logbook's final note agrees with it (~4.30E+23 FLOPs, about 33 days on 1,024 "
         "A100s: 147 TFLOP/s per GPU, the rate the schedule was planned at)"),
        cluster=dict(network_gbps=200))


def _torchtitan() -> list[Run]:
    model = LLAMA3_8B  # Llama 3.1 8B has Llama 3 8B's shape (8.03B parameters)
    proxy = ("Llama 3.1 8B as labkit.models.LLAMA3_8B (SwiGLU, 8 key/value heads, RMSNorm, "
             "RoPE, no biases, untied: 8.03B parameters)",)
    runs = []
    for gpus, tps in ((8, 5762), (128, 5605)):
        runs.append(Run(
            f"torchtitan_8B_fsdp{gpus}", TITAN, model, Parallelism.of(fsdp=gpus, dp_kind="fsdp"),
            "H100-96GB", 2 * gpus, 1, TOKENS, tps,
            dict(selective_recompute="op", flash_attention=True, framework="torchtitan"),
            proxy + ("local batch 2 of 8,192 tokens; FSDP2 bf16 parameters, fp32 reduce",
                     "selective activation checkpointing: torchtitan's op policy (matmul and "
                     "attention outputs kept but every second matmul's, the rest recomputed)",
                     "SDPA flash attention", "Llama's elementwise ops (RMSNorm, SwiGLU, RoPE "
                     "in eager mode) costed as counted on meta tensors")))
    return runs


def _megatron_core() -> list[Run]:
    # (name, heads, hidden, layers, tp, pp, GPUs, batch, per-GPU TFLOP/s); dp is 48 in every row
    rows = (("1.7B", 16, 2048, 24, 1, 1, 48, 192, 408.8),
            ("7.1B", 32, 4096, 30, 2, 1, 96, 192, 465.9),
            ("16B", 48, 6144, 32, 4, 1, 192, 192, 489.1),
            ("32B", 56, 7168, 48, 8, 1, 384, 192, 459.6),
            ("70B", 64, 8192, 84, 8, 2, 768, 384, 419.7),
            ("119B", 80, 10240, 92, 8, 4, 1536, 768, 420.5),
            ("177B", 96, 12288, 96, 8, 6, 2304, 1152, 432.8),
            ("314B", 128, 16384, 96, 8, 8, 3072, 1536, 474.4),
            ("462B", 144, 18432, 112, 8, 16, 6144, 3072, 459.9))
    runs = []
    for name, heads, hidden, layers, tp, pp, gpus, batch, tflops in rows:
        dp = gpus // (tp * pp)
        runs.append(Run(
            f"mcore24_{name}", MCORE, gpt(hidden, heads, layers, vocab=131072, seq=4096),
            Parallelism.of(dp=dp, tp=tp, pp=pp, schedule="1f1b" if pp > 1 else None), "H100",
            batch, batch // dp if pp > 1 else 1, MCORE_TFLOPS, tflops,
            dict(flash_attention=True, sequence_parallel=tp > 1, zero_stage=1,
                 framework="megatron-core"),
            ("GPT blocks, vocabulary 131,072, sequence 4,096 (the README); untied embeddings "
             "(the rows' parameter counts: 1.7B and 7.1B are untied, tied would be 1.5B and "
             "6.6B)", "bf16 mixed precision (MFU is of the bf16 peak: 408.8 / 989 = 41%)",
             "micro-batch size not said: 1 where there is a pipeline (the rest of a "
             "replica's batch accumulated, its bubble shrinking with more micro-batches), "
             "the replica's whole batch (4) where there is none (Narayanan et al. 2021, "
             "section 3.5: without a pipeline a larger micro-batch only raises throughput; "
             "and at 1 the 32B row's fp32 gradients, 15.8 GB a rank over one NIC, could hide "
             "only under the last micro-batch's backward, a step slower than published)",
             "no activation recomputation (not said)", "--overlap-grad-reduce and "
             "--overlap-param-gather: the distributed optimizer (ZeRO-1 over dp)",
             "--tp-comm-overlap, which needs sequence parallelism: sequence parallel where "
             "tp > 1", "1F1B without interleaving: 92 / 4 = 23 and 112 / 16 = 7 layers per "
             "stage admit no even 2-chunk split (the table does not say)",
             "Transformer Engine's fused attention: cuDNN's on Hopper (TE 1.6-1.9), at its "
             "published forward and backward rates (hardware.CUDNN_H100_TFLOPS); dropout "
             "taken as off (Megatron's default 0.1 is not said either way, and no rate "
             "with dropout is published)")))
    return runs


def _foundry() -> list[Run]:
    # (name, d_model, heads, layers, GPUs, micro-batch, accumulation, checkpointing, T/s/GPU)
    rows = (("1b", 2048, 16, 24, 8, 14, 1, False, 45455),
            ("3b", 2560, 20, 32, 16, 10, 3, False, 24142),
            ("7b", 4096, 32, 32, 8, 6, 1, False, 10643),
            ("13b", 5120, 40, 40, 8, 2, 1, False, 4792),
            ("30b", 7168, 56, 48, 8, 3, 21, True, 2002),
            ("70b", 8192, 64, 80, 64, 8, 4, True, 1039))
    runs = []
    for name, d, heads, layers, gpus, mbs, accumulation, ckpt, tps in rows:
        runs.append(Run(
            f"mpt_{name}_{gpus}gpu", FOUNDRY,
            dataclasses.replace(gpt(d, heads, layers, vocab=50368), tie_embeddings=True),
            Parallelism.of(fsdp=gpus, dp_kind="fsdp"), "H100", mbs * accumulation * gpus,
            accumulation, TOKENS, tps,
            dict(activation_checkpointing=ckpt, flash_attention=True, framework="composer"),
            ("MPT blocks as labkit's GPT blocks with a tied head: MPTConfig's defaults in "
             "llm-foundry v0.3.0 (the runs' code) keep biases (no_bias False), LayerNorm and "
             "learned positions (alibi False), and the yamls do not change them: the "
             "parameters equal the table's NumParams exactly",
             "sequence 2,048; the table's micro-batch and accumulation (sweep.sh), no dropout "
             "(MPTConfig's pdrops are 0)",
             "Composer's FSDP FULL_SHARD with DEFAULT mixed precision: bf16 parameters "
             "gathered, fp32 sharded state, gradients reduce-scattered after every "
             "micro-batch (frameworks.py 'composer')",
             "UNSURE: the reduction's dtype. llm-foundry v0.3.0 takes composer >=0.16.3,<0.17; "
             "composer 0.16.3 (2023-09-26) reduces in bf16 (reduce_dtype None), 0.16.4 "
             "(2023-10-11) in fp32, and the runs' date is not published (the table landed "
             "2023-10-19): taken as fp32",
             "the table's runs: torch 2.1, CUDA 12.1 (sweep.sh's image), llm-foundry v0.3.0 "
             "(submit_benchmarks.py's git_branch), attn_impl 'triton' and low-precision "
             "LayerNorm (submit_benchmarks.py), of llm-foundry b2a43a1, 2023-10; activation "
             "checkpointing as the table's column")))
    return runs


def _llama3() -> list[Run]:
    # Llama 3 405B proxy: 126 GPT blocks at width 16384 (12 d^2 = 3.22B; Llama's block
    # 3.19B: SwiGLU 3 x 16384 x 53248, GQA 8 kv heads). labkit.models.LLAMA3_405B itself
    # counts a first stage of 94.7 GB here (eager SwiGLU keeps 4 d_ff-wide tensors, and 126
    # layers split evenly put 8 on it; the paper takes a layer off the first and last
    # stages, section 3.3.2, and its kernels are not published)
    model = gpt(16384, 128, 126, vocab=128256, seq=8192)
    runs = []
    for gpus, dp, tflops in ((8192, 64, 430), (16384, 128, 400)):
        runs.append(Run(
            f"llama3_405B_{gpus}", LLAMA3, model,
            Parallelism.of(fsdp=dp, tp=8, pp=16, schedule="interleaved_1f1b", dp_kind="fsdp"),
            "H100", 2048, 2048 // dp, COUNTED_TFLOPS, tflops,
            dict(selective_recompute=True, sequence_parallel=True, flash_attention=True,
                 framework="llama3"),
            ("Llama 3 405B as GPT blocks (width 16384, 126 blocks: parameters within 1%)",
             "16M tokens per step: 2,048 sequences of 8,192", "micro-batch size 1",
             "interleaved 1F1B at 2 chunks per stage, the fewest interleaving takes (the "
             "paper interleaves, section 3.3.2, without saying how many chunks)",
             "selective recomputation and sequence parallelism (the paper does not say)",
             "FSDP's model shards kept gathered from each micro-batch's forward to its "
             "backward (section 3.3.2), and pipelined as torch.distributed.pipelining runs "
             "FSDP stages (the paper does not say): a stage gathered once a step and kept to "
             "its end, its gradients held unsharded and reduce-scattered after the last "
             "backward; kernels and overlap as Megatron-Core's (not said)",
             "TFLOP/s from labkit's counted model FLOPs (the paper gives no formula)")))
    return runs


RUNS: tuple[Run, ...] = tuple(_narayanan() + _korthikanti() + [_bloom(), _opt()] + _torchtitan()
                              + _megatron_core() + _foundry() + _llama3())


def run(name: str) -> Run:
    """The published run ``name`` (``RUNS``); an unknown name lists the known ones."""
    for r in RUNS:
        if r.name == name:
            return r
    raise ValueError(f"no published run {name!r}: the table has {', '.join(r.name for r in RUNS)}")


def project_run(published: Run):
    """``labkit.plan.project`` of the run at its published layout, batch and levers."""
    from labkit.plan.cluster import GPUCluster
    from labkit.plan.project import project

    cluster = GPUCluster(published.gpu, nodes=published.layout.size // 8, **published.cluster)
    levers = {"precision": "mixed", **published.levers}  # the run's own, where it names one
    return project(published.model, published.layout, cluster,
                   global_batch=published.global_batch, micro_batches=published.micro_batches,
                   **levers)


def in_unit(published: Run, projection) -> float:
    """The projected step in the published figure's unit."""
    step, gpus = projection.step_s, published.layout.size
    if published.unit == SECONDS:
        return step
    if published.unit == TOKENS:
        return published.global_batch * published.model.seq_len / step / gpus
    if published.unit == MEGATRON_TFLOPS:
        return megatron_flops(published.model, published.global_batch) / step / gpus / 1e12
    if published.unit == MCORE_TFLOPS:
        return megatron_core_flops(published.model, published.global_batch) / step / gpus / 1e12
    if published.unit == COUNTED_TFLOPS:
        return projection.costs.model_flops / step / gpus / 1e12
    raise ValueError(f"unknown unit {published.unit!r}")


def error(published: Run, projected: float) -> float:
    """Projected over published, less 1, as a throughput: a time (s per iteration) is
    inverted, so that -10% always means 'projected 10% slower than published'."""
    if published.unit == SECONDS:
        return published.published / projected - 1
    return projected / published.published - 1


def compare(names=None) -> list[dict]:
    """One row per published run (all, or those ``names``): published and projected in the
    source's unit, the error, whether the layout fits, the source."""
    rows = []
    for r in [run(n) for n in names] if names is not None else RUNS:
        p = project_run(r)
        projected = in_unit(r, p)
        rows.append({"run": r.name, "unit": r.unit, "published": r.published,
                     "projected": projected, "error": error(r, projected), "fits": p.fits,
                     "peak_gb": p.peak_bytes / 1e9, "split": p.split(), "source": r.source})
    return rows
