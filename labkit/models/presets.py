"""Published decoder shapes as ``GPTConfig``s (never built for real: the planner counts them
on meta tensors). Each preset names its source; the parameter counts below are what
``labkit.models.count_parameters`` gives and what the source publishes.

* Llama 3 (Dubey et al. 2024, 'The Llama 3 Herd of Models', Table 3: layers, model
  dimension, FFN dimension, attention and key/value heads, SwiGLU, RoPE base 500,000; the
  vocabulary of 128,256 tokens and RMSNorm eps 1e-5 as the released ``config.json`` of
  meta-llama/Meta-Llama-3-8B; untied embeddings, no biases; sequence 8,192, the paper's
  pre-training length): 8B counts 8.03B parameters (the model card's 8.03B), 70B 70.55B,
  405B 405.85B.
* GPT-3 175B (Brown et al. 2020, 'Language Models are Few-Shot Learners', Table 2.1: 96
  layers, d_model 12,288, 96 heads of 128, context 2,048; GPT-2's 50,257-token BPE, learned
  positions, LayerNorm, a 4x GELU MLP with biases and the head tied to the token embedding,
  as GPT-2, whose architecture the paper says it uses): 174.6B parameters (published "175B").
"""

from __future__ import annotations

from labkit.models.gpt import GPTConfig


def llama(d_model: int, n_layers: int, n_heads: int, d_ff: int, *, n_kv_heads: int = 8,
          vocab_size: int = 128_256, seq_len: int = 8192, rope_theta: float = 500_000.0,
          tie_embeddings: bool = False) -> GPTConfig:
    """A Llama-style decoder: SwiGLU, grouped-query attention, RMSNorm, RoPE, no biases."""
    return GPTConfig(vocab_size=vocab_size, seq_len=seq_len, d_model=d_model, n_heads=n_heads,
                     n_layers=n_layers, mlp="swiglu", d_ff=d_ff, n_kv_heads=n_kv_heads,
                     norm="rmsnorm", position="rope", rope_theta=rope_theta, bias=False,
                     tie_embeddings=tie_embeddings)


LLAMA3_8B = llama(4096, 32, 32, 14_336)
LLAMA3_70B = llama(8192, 80, 64, 28_672)
LLAMA3_405B = llama(16_384, 126, 128, 53_248)
GPT3_175B = GPTConfig(vocab_size=50_257, seq_len=2048, d_model=12_288, n_heads=96, n_layers=96,
                      tie_embeddings=True)

# name -> (config, source, published parameter count)
PUBLISHED_SHAPES = {
    "llama3-8b": (LLAMA3_8B, "Dubey et al. 2024, Table 3; meta-llama/Meta-Llama-3-8B", 8.03e9),
    "llama3-70b": (LLAMA3_70B, "Dubey et al. 2024, Table 3; meta-llama/Meta-Llama-3-70B",
                   70.6e9),
    "llama3-405b": (LLAMA3_405B, "Dubey et al. 2024, Table 3; meta-llama/Llama-3.1-405B",
                    405.9e9),
    "gpt3-175b": (GPT3_175B, "Brown et al. 2020, Table 2.1", 175.0e9),
}
