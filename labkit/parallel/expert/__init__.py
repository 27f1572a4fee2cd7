"""Expert parallelism: a mixture of experts' experts spread over the data-parallel ranks,
tokens dispatched to them and combined with all-to-all (``dispatch.py``), the split and its
gradients (``apply.py``), expert load recorded per step (``observe.py``). The model is
``labkit.models.MoEGPTConfig``; the layout ``Layout(dp=N, ep=N)``."""

from labkit.parallel.expert.apply import shard_experts, sync_expert_gradients
from labkit.parallel.expert.dispatch import AllToAll, ExpertExchange
from labkit.parallel.expert.observe import ExpertObserver, dropped_tokens, expert_load

__all__ = ["AllToAll", "ExpertExchange", "ExpertObserver", "dropped_tokens",
           "expert_load", "shard_experts", "sync_expert_gradients"]
