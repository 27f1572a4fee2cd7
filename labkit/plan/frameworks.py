"""How each training framework runs a layout, as its documentation and papers say: what the
planner needs to know about one beside the layout (``project(..., framework=...)``).

* ``dp_overlap``: whether the data-parallel gradient reduction runs during backward (buckets
  launched as their gradients are ready) or after it, whole.
* ``bucket_bytes(params, dp, grad_bytes)``: the bytes of one gradient bucket, as the
  framework sizes it (each bucket is one collective and pays its latency).
* ``tp_overlap``: whether tensor parallelism's collectives run under the matmuls that produce
  and consume them (Megatron-Core's ``--tp-comm-overlap``, Transformer Engine's userbuffers)
  or on the critical path.
* ``pp_scatter``: whether a pipeline send carries 1/tp of the activation from each tp rank
  (Megatron's scatter/gather: Narayanan et al. 2021, section 4.1; with sequence parallelism
  the activation is sequence-split already) or the whole activation from each.
* ``vocab_parallel``: whether the embedding and the output head are split over tp (Megatron's
  ``VocabParallelEmbedding`` and parallel LM head; torchtitan's TP plan shards both).
* ``attention_dropout``: whether attention's probabilities pass through dropout (Megatron's
  GPT default ``--attention-dropout 0.1``): on the math path a mask of (heads, seq, seq) is
  written forward and read backward, and the probabilities read and written once more.
* ``attention_kernel``: the fused attention kernel the framework calls on GPUs: "fa2"
  (FlashAttention-2: PyTorch SDPA's flash backend, flash-attn 2, timed at its published
  rate, ``hardware.FA2_H100_TFLOPS``), "triton" (FlashAttention in Triton: slower than FA2
  by ``project.ATTENTION_SLOWER``) or "fused" (Transformer Engine's FusedAttention, which
  TE 1.6-1.9 select over flash-attn on sm90: cuDNN's kernels, ``hardware.CUDNN_H100_TFLOPS``;
  the matmul rate on a GPU without published figures).
* ``fused_saves``: whether RMSNorm and grouped-query attention keep for backward what fused
  kernels keep (``fused_saves.py``: the norm's input and one statistic per row; keys and
  values as they are) or what eager composite ops keep (the normalized input too; keys and
  values repeated for every query head before attention).
* ``backward_prefetch``: when FSDP issues a backward all-gather: "pre" (before the current
  unit's gradients, overlapping them: torch FSDP1's BACKWARD_PRE; FSDP2 prefetches explicitly
  in backward by default, pytorch PR #128884) or "post" (after them, FSDP1's BACKWARD_POST:
  "this overlaps the current reduce-scatter and the next gradient computation", torch's
  ``BackwardPrefetch`` docstring; the all-gather itself is waited for).
* ``reduce_every_micro_batch``: whether FSDP reduce-scatters the gradients after every
  micro-batch's backward (Composer 0.16: ``Trainer._train_microbatch`` keeps gradients local
  with ``no_sync`` under DDP only) or once a step, after the last (torch FSDP's
  ``no_sync``, FSDP2's ``set_requires_gradient_sync(False)``: labkit's engines).
* ``param_gather``: whether, under the distributed optimizer (``zero_stage`` >= 1), the
  gradients are reduce-scattered during backward and the updated parameters all-gathered
  during the next forward, in the compute dtype (Megatron-Core's ``--overlap-grad-reduce
  --overlap-param-gather``: ``param_and_grad_buffer.py``'s ``_reduce_scatter_base``, at
  f2e5db402c), not one AllReduce of the gradients.
* ``reshard_after_forward``: whether FSDP frees each unit's gathered parameters after its
  forward and gathers them again in backward (FSDP2's default, FSDP1's FULL_SHARD) or keeps
  them gathered until that micro-batch's backward is done, gathering each unit once per
  micro-batch (FSDP2's ``reshard_after_forward=False``; Llama 3's FSDP, Dubey et al. 2024,
  section 3.3.2: "for model shards we do not reshard after forward computation to avoid an
  extra all-gather communication during backward passes").
* ``pp_reshard_after_forward``: the same choice in a pipeline, where a framework may set it
  apart (torchtitan: "For PP, by default do not reshard after forward to avoid
  per-microbatch all-gathers", ``torchtitan/distributed/fsdp.py``
  ``get_fsdp_reshard_after_forward_policy`` at b5bcd76c6); None: as ``reshard_after_forward``.
* ``reduce_in_compute_dtype``: whether the gradients travel in the compute dtype (fp16/bf16)
  under mixed precision, or in fp32 (torch FSDP2's fp32 ``reduce_dtype``, Megatron's fp32
  main gradients); fairscale's FSDP as metaseq runs it reduces fp16 gradients
  (``fp32_reduce_scatter`` off by default: metaseq/dataclass/configs.py).
* ``reentrant_checkpoint``: whether activation checkpointing reruns each block's whole
  forward in backward, its tp collectives with it (Megatron's and metaseq's
  ``CheckpointFunction``, an ``autograd.Function``), or stops once backward has what it
  needs (torch.utils.checkpoint, non-reentrant: the last row layer's AllReduce is not rerun).
* ``pipelines``: whether the framework has pipeline parallelism at all (metaseq and
  Composer have none).
* ``torch_pipelining``: whether its pipeline is torch.distributed.pipelining driving FSDP2
  or ``replicate`` modules, which reduces a stage's gradients after its last micro-batch's
  backward (``PipelineStage.perform_reduce_grad``: "REDUCE_GRAD action is scheduled after
  all microbatches W, B actions"), under no compute: labkit's engines, torchtitan, and
  Llama 3's stack as the planner takes it.
* ``distribute_checkpoints``: whether, under activation checkpointing, each tp rank keeps
  1/tp of a block's checkpointed input and all-gathers it before recomputing the block in
  backward (Megatron's and metaseq's ``--distribute-checkpointed-activations``), or keeps the
  whole input.
* ``state_recipe``: the ``labkit.costs.model_state_bytes`` row the framework's mixed precision
  keeps (torch FSDP2/DDP over fp32 parameters: "fp32-master"; Megatron: bf16 weights, fp32
  main gradients, fp32 master weights and moments: "megatron").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

MiB = 2**20


def _torch_ddp_bucket(params: float, dp: int, grad_bytes: float) -> float:
    # torch.nn.parallel.DistributedDataParallel(bucket_cap_mb=25): the documented default
    return 25 * MiB


def _megatron_core_bucket(params: float, dp: int, grad_bytes: float) -> float:
    # Megatron-Core DistributedDataParallelConfig.bucket_size: None, set by the DDP wrapper
    # to max(40,000,000, 1,000,000 x dp) parameters (megatron/core/distributed/
    # distributed_data_parallel.py), in the gradients' bytes per parameter
    per_param = grad_bytes / max(params, 1)
    return max(40_000_000, 1_000_000 * dp) * per_param


def _one_buffer(params: float, dp: int, grad_bytes: float) -> float:
    # Megatron-LM 2021: one AllReduce of the contiguous gradient buffer after backward
    return max(grad_bytes, 1.0)


@dataclass(frozen=True)
class Framework:
    name: str
    dp_overlap: bool
    bucket_bytes: Callable[[float, int, float], float]
    tp_overlap: bool
    pp_scatter: bool
    vocab_parallel: bool
    state_recipe: str
    source: str
    attention_dropout: bool = False
    attention_kernel: str = "fa2"
    backward_prefetch: str = "pre"
    fused_saves: bool = True
    reduce_every_micro_batch: bool = False
    param_gather: bool = False
    reshard_after_forward: bool = True
    distribute_checkpoints: bool = False
    pp_reshard_after_forward: bool | None = None
    reduce_in_compute_dtype: bool = False
    reentrant_checkpoint: bool = False
    pipelines: bool = True
    torch_pipelining: bool = False

    def gradient_bytes(self, precision: str) -> int:
        """Bytes a gradient element takes in memory and on the wire when reduced: fp32 under
        mixed precision, the compute dtype where the framework reduces in it
        (``reduce_in_compute_dtype``) or where everything is bf16."""
        low = precision == "bf16" or (self.reduce_in_compute_dtype and precision != "fp32")
        return 2 if low else 4

    def reshards_after_forward(self, pipelined: bool) -> bool:
        """``reshard_after_forward``, or in a pipeline ``pp_reshard_after_forward``."""
        if pipelined and self.pp_reshard_after_forward is not None:
            return self.pp_reshard_after_forward
        return self.reshard_after_forward


FRAMEWORKS: dict[str, Framework] = {f.name: f for f in (
    Framework("labkit", True, _torch_ddp_bucket, False, False, False, "fp32-master",
              "labkit's engines: torch DDP (25 MiB buckets, overlapped with backward), FSDP2, "
              "DTensor TP (synchronous), torch.distributed.pipelining (whole activations)",
              torch_pipelining=True),
    Framework("torchtitan", True, _torch_ddp_bucket, False, False, True, "fp32-master",
              "torchtitan: FSDP2 with fp32 sharded parameters and fp32 reduce "
              "(mixed_precision_reduce), every block resharded after forward but the last "
              "(parallelize_llama.apply_fsdp: gathered again in backward), TP plan sharding "
              "embeddings and output, async TP off by default, attention through SDPA's "
              "flash backend (FlashAttention-2); its Llama (models/llama/model.py, 2024-12) "
              "repeats keys and values for each query group before SDPA (repeat_kv) and "
              "computes RMSNorm in eager ops (norm_type 'rmsnorm'); in a pipeline no block "
              "resharded after forward (get_fsdp_reshard_after_forward_policy)",
              fused_saves=False, pp_reshard_after_forward=False, torch_pipelining=True),
    Framework("composer", True, _torch_ddp_bucket, False, False, False, "fp32-master",
              "MosaicML Composer (llm-foundry's MPT benchmarks): torch FSDP1 FULL_SHARD "
              "(parameters gathered in forward and again in backward), mixed_precision "
              "DEFAULT (bf16 parameters in compute, fp32 gradient reduction from composer "
              "0.16.4, fp32 sharded state: composer's get_mixed_precision), gradients "
              "reduce-scattered after every micro-batch (no_sync is DDP's only: "
              "Trainer._train_microbatch), backward_prefetch BACKWARD_POST "
              "(composer's default: dist_strategy.prepare_fsdp_module), attn_impl 'triton' "
              "(Dao's flash_attn_triton.py for pre-MLIR Triton, 'slightly slower' than "
              "FlashAttention-1: FlashAttention-2's rate over 1.7, the least of Dao 2023's "
              "1.7-3.0x over FA1: project.ATTENTION_SLOWER)", backward_prefetch="post",
              attention_kernel="triton", reduce_every_micro_batch=True, pipelines=False),
    Framework("megatron-2021", False, _one_buffer, False, True, True, "megatron",
              "Megatron-LM 2021 (Narayanan et al. 2021): gradients AllReduced after backward "
              "from one contiguous buffer; TP collectives on the critical path; "
              "scatter/gather pipeline sends (section 4.1); attention and hidden dropout 0.1 "
              "(the GPT defaults of megatron/arguments.py); checkpointing by its reentrant "
              "CheckpointFunction (megatron/mpu/random.py)", attention_dropout=True,
              reentrant_checkpoint=True),
    Framework("megatron-deepspeed", False, _one_buffer, False, False, True, "megatron",
              "Megatron-DeepSpeed (BLOOM): Megatron's tensor parallelism and attention "
              "dropout, DeepSpeed's pipeline engine (whole activations sent, gradients "
              "reduced after the last micro-batch) and ZeRO-1 over bf16 weights with fp32 "
              "gradient accumulation; activation checkpointing by DeepSpeed's "
              "CheckpointFunction, an autograd.Function (deepspeed/runtime/"
              "activation_checkpointing/checkpointing.py)",
              attention_dropout=True, reentrant_checkpoint=True),
    Framework("megatron-core", True, _megatron_core_bucket, True, True, True, "megatron",
              "Megatron-Core: --overlap-grad-reduce with buckets of max(40M, 1M x dp) "
              "parameters, --tp-comm-overlap, distributed optimizer (docs/source/api-guide/"
              "dist_optimizer.md: 18 bytes per parameter, 6 + 12/d distributed), "
              "Transformer Engine's fused attention (cuDNN's on Hopper: TE v1.7 "
              "transformer_engine/pytorch/attention.py, 'Select FusedAttention on sm90'); "
              "bf16 gradients reduced in fp32 (megatron/training/arguments.py sets "
              "accumulate_allreduce_grads_in_fp32 "
              "under --bf16); full recomputation by the reentrant CheckpointFunction "
              "(megatron/core/tensor_parallel/random.py)", attention_kernel="fused",
              param_gather=True, reentrant_checkpoint=True),
)}
# Meta's stack for Llama 3 (Dubey et al. 2024, section 3.3.2): 4D parallelism with FSDP over
# the data-parallel ranks, its model shards kept gathered from forward to backward. What the
# paper does not describe (kernels, tp overlap, buckets, mixed-precision state) is taken as
# Megatron-Core's.
FRAMEWORKS["llama3"] = dataclasses.replace(
    FRAMEWORKS["megatron-core"], name="llama3", reshard_after_forward=False,
    torch_pipelining=True,
    source="Llama 3's 4D parallelism (Dubey et al. 2024, section 3.3.2): FSDP sharding "
           "optimizer states and gradients, model shards not resharded after forward; "
           "the rest (not published) as Megatron-Core's row: " + FRAMEWORKS["megatron-core"].source)

# metaseq, the code OPT-175B trained with: the flags of its launcher
# (metaseq/launcher/opt_baselines.py at f7ffa5f: --ddp-backend fully_sharded
# --no-reshard-after-forward, --memory-efficient-fp16, --checkpoint-activations
# --distribute-checkpointed-activations, --model-parallel-size, vocab_parallel_cross_entropy,
# --dropout 0.1 --attention-dropout 0.1): fairscale's FSDP beside Megatron's tensor
# parallelism, whose collectives run on the critical path.
FRAMEWORKS["metaseq"] = Framework(
    "metaseq", True, _torch_ddp_bucket, False, False, True, "fp16-no-master",
    "metaseq (OPT-175B): fairscale FSDP with --no-reshard-after-forward, Megatron tensor "
    "parallelism (synchronous, vocabulary-parallel embedding and cross entropy), "
    "--memory-efficient-fp16 (fp16 weights and gradients, fp32 Adam moments, no master copy), "
    "--distribute-checkpointed-activations, attention dropout 0.1 on the math path "
    "(metaseq/launcher/opt_baselines.py); fp16 gradients reduce-scattered (fp32_reduce_scatter "
    "off: metaseq/dataclass/configs.py); its reentrant CheckpointFunction "
    "(metaseq/modules/checkpoint_activation_wrapper/checkpoint_activations.py); no pipeline "
    "parallelism", attention_dropout=True, reshard_after_forward=False,
    distribute_checkpoints=True, reduce_in_compute_dtype=True, reentrant_checkpoint=True,
    pipelines=False)


def framework(name: str) -> Framework:
    """The table's row ``name``; an unknown name lists the known ones."""
    if name not in FRAMEWORKS:
        raise ValueError(f"unknown framework {name!r}: the planner knows "
                         f"{', '.join(FRAMEWORKS)}")
    return FRAMEWORKS[name]
