"""What a run's matmul shapes lose to tile and wave quantization: the fraction of the
microbenchmarked matmul rate (``hardware.GPU.matmul_efficiency``) the step's GEMMs reach at
their own shapes.

A GEMM writes its (rows, cols) output in tiles, one thread block each, and the GPU runs as
many blocks at once as it has SMs: a wave. A last wave that fills only some SMs (wave
quantization), and tiles that hang over the output's edge (tile quantization), run at the full
cost of a tile (NVIDIA, 'Matrix Multiplication Background User's Guide', sections 'Tile
quantization' and 'Wave quantization'; Anthony et al. 2024, 'The Case for Co-Designing Model
Architectures with Hardware', arXiv 2401.14489, section 4). The canonical efficient tile is
128 x 256 (Bekman, ml-engineering compute/accelerator/benchmarks/README.md, 'What makes a fast
shape', branch fast-mamf 082816f), and the MAMF/MSMF figures the rows take are measured at
shapes whose "wave_eff >= ~0.99" (the same section): a run's GEMMs at their shapes are slower
by their wave efficiency, nothing else assumed.

Each linear of a decoder block (and the head) runs three GEMMs a micro-batch: forward
(tokens, out), the input's gradient (tokens, in) and the weight's gradient (in, out). Their
efficiencies are weighted by FLOPs (a harmonic mean: time adds up); the attention's batched
matmuls (a (seq, seq) output per head, many waves) and every other FLOP are taken at the full
rate. A GPU row without an SM count (``GPU.sms`` 0: this machine, workstation cards) is not
corrected.
"""

from __future__ import annotations

import functools
import math

from torch import nn

from labkit.plan.counts import is_decoder, sample_counts

TILE = (128, 256)  # rows x cols of the output a thread block computes (fast-mamf README)


def wave_efficiency(rows: int, cols: int, sms: int) -> float:
    """Useful output over what the waves compute, for a (rows, cols) output in ``TILE``
    tiles on ``sms`` SMs, the better of the tile's two orientations (cuBLAS picks)."""
    best = 0.0
    for tile_rows, tile_cols in (TILE, TILE[::-1]):
        tiles = math.ceil(rows / tile_rows) * math.ceil(cols / tile_cols)
        waves = math.ceil(tiles / sms)
        best = max(best, rows * cols / (waves * sms * tile_rows * tile_cols))
    return best


@functools.lru_cache(maxsize=256)
def _linear_shapes(model_config, tp: int, vocab_parallel: bool) -> tuple[tuple[int, int], ...]:
    """(in, out) of every linear a tp rank runs for one sample: one block's, once per layer,
    and the head's."""
    from labkit.plan.blocks import _local_block

    block = _local_block(model_config, tp)
    shapes = [(m.in_features, m.out_features) for m in block.modules()
              if isinstance(m, nn.Linear)] * model_config.n_layers
    vocab = model_config.vocab_size // (tp if vocab_parallel else 1)
    return (*shapes, (model_config.d_model, vocab))


@functools.lru_cache(maxsize=1024)
def gemm_efficiency(model_config, tp: int, tokens: int, sms: int,
                    vocab_parallel: bool = False, fused_attention: bool = False) -> float:
    """The fraction of the matmul rate a decoder's step reaches at its GEMM shapes (the
    module docstring): 1.0 where no SM count is known or the model is not a decoder.
    ``tokens``: a micro-batch's tokens on one rank (the GEMMs' long side);
    ``fused_attention``: the attention's FLOPs are timed apart (a fused kernel's rate), so
    the share is of the rest."""
    if not (sms and is_decoder(model_config) and tokens > 0):
        return 1.0
    work = slow = 0.0
    for k, n in _linear_shapes(model_config, tp, vocab_parallel):
        flops = 2.0 * tokens * k * n  # each of the three GEMMs
        for rows, cols in ((tokens, n), (tokens, k), (k, n)):
            work += flops
            slow += flops / wave_efficiency(rows, cols, sms)
    # the linears' share of a sample's FLOPs (forward and backward: 3 GEMMs of 2 s k n each),
    # on the whole model's shapes
    linear = sum(6.0 * model_config.seq_len * k * n
                 for k, n in _linear_shapes(model_config, 1, False))
    rest = sample_counts(model_config).flops
    if fused_attention:  # the math path's 3 x (Q K^T and P V) forward, counted on meta
        from labkit.plan.step import attention_flops

        rest -= 3 * attention_flops(model_config)
    share = min(1.0, linear / rest)
    return 1.0 / (share * slow / work + (1.0 - share))
