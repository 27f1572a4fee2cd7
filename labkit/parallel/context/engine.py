"""Which engine runs context parallelism: PyTorch's own on GPUs, labkit's ring on CPU.

* "torch": ``torch.distributed.tensor.experimental.context_parallel``. Each step's forward
  and backward run inside it: it shards the step's inputs and targets along the sequence
  (its head-tail load balancer: rank i keeps chunks i and 2N-1-i of 2N, the same tokens as
  labkit's ``sharding.py``) and swaps ``F.scaled_dot_product_attention`` for its ring
  attention over the cp mesh (keys and values passed to the next rank: ``alltoall``
  rotation, the ring labkit's own engine also runs).
* "ring": labkit's from-scratch ring attention (``ring.py``): the loop shards the batch.
* "auto" (the default): "torch" when the ranks are CUDA devices, "ring" on CPU, where torch
  2.13's engine cannot run: the CPU kernel's op (``CPU_REFUSAL``) has no sharding strategy
  for its sequence-sharded inputs.
"""

from __future__ import annotations

import contextlib

ENGINES = ("auto", "ring", "torch")
LABELS = {"ring": "labkit ring", "torch": "torch context_parallel"}
CPU_REFUSAL = "aten._scaled_dot_product_flash_attention_for_cpu.default has no sharding strategy"


def resolve_engine(choice: str, device_type: str) -> str:
    """"ring" or "torch" for ``choice`` ("auto", "ring", "torch") on ``device_type`` ranks:
    decided once, before any rank starts (``labkit/training/run.py``); the ranks read the
    answer from their run's engines."""
    if choice not in ENGINES:
        raise ValueError(f"cp_engine must be one of {ENGINES}, got {choice!r}")
    if choice == "auto":
        return "torch" if device_type == "cuda" else "ring"
    if choice == "torch" and device_type != "cuda":
        raise ValueError(f"cp_engine='torch' runs on CUDA ranks only: on {device_type} torch "
                         f"{_torch_version()}'s context_parallel fails ({CPU_REFUSAL}); use "
                         "cp_engine='ring' or 'auto' (the ring runs there)")
    return choice


def _torch_version() -> str:
    import torch

    return torch.__version__.split("+")[0]


@contextlib.contextmanager
def torch_context_parallel(mesh, batch: tuple, seq_dim: int = 1):
    """Run the body (a step's forward and backward) under PyTorch's context parallelism:
    ``batch``'s (batch, seq) tensors become this rank's (batch, seq / cp) tokens in place
    and stay so (they are not needed whole again)."""
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import set_rotate_method

    set_rotate_method("alltoall")  # keys and values go to the next rank: a ring
    buffers = list(batch)
    with context_parallel(mesh, buffers=buffers, buffer_seq_dims=[seq_dim] * len(buffers),
                          no_restore_buffers=set(buffers)):
        yield
