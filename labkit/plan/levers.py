"""The per-run choices besides the layout (``Lever``) and one rank's counted costs of a step
(``StepCosts``): what ``step.py`` and ``memory_model.py`` compute and ``project.py`` times."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Lever:
    """The per-run choices besides the layout (the ``TrainConfig`` levers)."""

    global_batch: int
    micro_batches: int = 1
    # "fp32", "bf16", "mixed" (bf16 compute), "fp16" (fp16 compute, dynamic loss scaling)
    precision: str = "mixed"
    activation_checkpointing: bool = False
    optimizer: str = "adam"
    # selective recomputation: True (or "attention"): Korthikanti et al. 2022's, the attention
    # core (scores, softmax) recomputed in backward; "op": torchtitan's op-level policy, every
    # op recomputed but the matmuls' and attention's outputs, of which every second matmul's
    selective_recompute: bool | str = False
    # Korthikanti et al. 2022: norms and residuals split over the tp ranks along the sequence
    sequence_parallel: bool = False
    # ZeRO over the dp replicas beside tp/pp (Megatron's distributed optimizer: 1; 2 shards
    # the gradients too); 0: none (the layout's own dp_kind still applies)
    zero_stage: int = 0
    # a fused attention kernel (FlashAttention): no seq x seq scores written or kept
    flash_attention: bool = True
    framework: str = "labkit"  # labkit.plan.frameworks.FRAMEWORKS
    # model chunks per pipeline rank (interleaved 1F1B, Narayanan et al. 2021 section 2.2.2):
    # 0 takes the layout's (2 for "interleaved_1f1b", else 1)
    virtual_stages: int = 0


@dataclass
class StepCosts:
    """One rank's costs of one step.

    Attributes:
        flops: FLOPs this rank computes (recomputation included).
        model_flops: the model's FLOPs per step over all ranks (no recomputation): MFU's top.
        memory_bound_bytes: bytes moved by ops that are bandwidth-bound (embedding lookups and
            their gradients, the optimizer's passes over its state:
            ``counts.optimizer_counts``).
        memory: peak bytes by category; comm: {(dim, kind): (calls, tensor bytes)}.
        samples, tokens: per step, all ranks.
        attention_flops: the part of ``flops`` a fused attention kernel does (timed at the
            kernel's rate, not the matmuls').
    """

    flops: float
    model_flops: float
    memory_bound_bytes: float
    memory: dict[str, float]
    comm: dict[tuple[str, str], tuple[int, float]] = field(default_factory=dict)
    samples: int = 0
    tokens: int = 0
    memory_method: str = "counted per block, scaled"
    attention_flops: float = 0.0

    @property
    def peak_bytes(self) -> float:
        return sum(self.memory.values())


def compute_bytes(precision: str) -> int:
    return 4 if precision == "fp32" else 2
