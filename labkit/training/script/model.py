"""The model and the data of a written script: the zoo's own source (``labkit/models``),
with its config written out as a dataclass of the run's values."""

from __future__ import annotations

import dataclasses
import json
import re

from labkit.models import gpt, mlp
from labkit.models.gpt_split import GPTEmbedding, block_styles
from labkit.training.script.source import Piece, block, source_of

_DATA = {"mlp": mlp.mlp_batch, "gpt": gpt.gpt_batch}
_IMPORTS = {"mlp": ("import torch", "from torch import nn"),
            "gpt": ("import torch", "from torch import nn",
                    "from torch.nn import functional as F")}
MODEL_CLASS = {"mlp": "MLP", "gpt": "GPT"}
DATA_FUNCTION = {"mlp": "mlp_batch", "gpt": "gpt_batch"}


def _literal(value) -> str:
    return json.dumps(value) if isinstance(value, str) else repr(value)


def config_piece(config, code: str | None = None) -> Piece:
    """``config`` as a frozen dataclass whose defaults are its values; what the zoo's config
    derives (``d_head``...) is written out as fields of its own. With ``code`` (the rest of
    the script), only the fields it reads (``config.NAME``)."""
    cls = type(config)

    def read(name: str) -> bool:
        return code is None or re.search(rf"\bconfig\.{name}\b", code) is not None

    lines = [f"{f.name}: {f.type} = {_literal(getattr(config, f.name))}"
             for f in dataclasses.fields(config) if read(f.name)]
    derived = [name for name, value in vars(cls).items()
               if isinstance(value, property) and name != "name" and read(name)]
    lines += [f"{name}: int = {getattr(config, name)!r}  # derived ({cls.__name__}.{name})"
              for name in derived]
    body = "\n".join(f"    {line}" for line in lines)
    code = (f"@dataclass(frozen=True)\nclass {cls.__name__}:\n"
            f'    """The model\'s shape: labkit.models.{cls.__name__} with this run\'s values."""'
            f"\n\n{body}")
    return Piece(code, ("from dataclasses import dataclass",))


def _cut(text: str, old: str, new: str = "") -> str:
    """``text`` with ``old`` replaced; ``old`` must be there (a change to the zoo's source
    fails here, loudly, rather than writing a model that differs from labkit's)."""
    if old not in text:
        raise RuntimeError(f"labkit/models/gpt.py no longer reads {old.strip()[:60]!r}: update "
                           "labkit/training/script/model.py")
    return text.replace(old, new)


_GQA = """        if self.group == 1:
            return qkv.chunk(3, dim=2)
        batch, seq, width = qkv.shape
        groups = qkv.view(batch, seq, -1, self.group + 2, self.d_head)
        q = groups[..., :self.group, :].reshape(batch, seq, -1)
        return q, groups[..., self.group, :].flatten(2), groups[..., self.group + 1, :].flatten(2)
"""
_MLP = """        if config.mlp == "swiglu":
            self.mlp = SwiGLU(config)
        else:
            d, hidden, bias = config.d_model, config.ff_width, config.bias
            self.mlp = nn.Sequential(nn.Linear(d, hidden, bias=bias), nn.GELU(),
                                     nn.Linear(hidden, d, bias=bias))
"""
_GELU = """        d, hidden, bias = config.d_model, config.ff_width, config.bias
        self.mlp = nn.Sequential(nn.Linear(d, hidden, bias=bias), nn.GELU(),
                                 nn.Linear(hidden, d, bias=bias))
"""
# the docstrings as they read in the source (each continuation line indented as there)
_GQA_ATTENTION_DOC = f'"""{gpt.causal_attention.__doc__}"""'
_GQA_SPLIT_DOC = f'"""{gpt.SelfAttention._split.__doc__}"""'
_HEAD = """        self.head = (TiedHead(self.tok) if config.tie_embeddings
                     else nn.Linear(config.d_model, config.vocab_size, bias=False))
"""


def _multi_head(text: str) -> str:
    """The GPT's attention without grouped-query attention's branches and their words."""
    text = _cut(text, _GQA, "        return qkv.chunk(3, dim=2)\n")
    text = _cut(text, "    if k.shape[1] != q.shape[1]:\n        return F.scaled_dot_"
                "product_attention(q, k, v, is_causal=True, enable_gqa=True)\n")
    text = _cut(text, "        self.group = config.n_heads // config.kv_heads  # query heads per "
                "key/value head\n")
    text = _cut(text, _GQA_ATTENTION_DOC, '"""Causal attention over the whole sequence; q, k, '
                'v (batch, head, seq, d_head)."""')
    return _cut(text, _GQA_SPLIT_DOC, '"""q, k and v (batch, seq, heads x d_head): the rows '
                "[q; k; v], sized from the\n        tensor (under tensor parallelism a rank "
                'holds only some heads)."""')


def gpt_source(config) -> str:
    """The zoo's GPT (``labkit/models/gpt.py``) with only the features ``config`` uses: a
    GPT-2-style block leaves out rotary embeddings, SwiGLU, grouped-query attention's split,
    RMSNorm and the tied head, each branch cut where the config does not take it."""
    rope, swiglu, tied = (config.position == "rope", config.mlp == "swiglu",
                          config.tie_embeddings)
    objects = [gpt.causal_attention, *[gpt.rotary] * rope, gpt.SelfAttention,
               *[gpt.SwiGLU] * swiglu, gpt.make_norm, gpt.Block, *[gpt.TiedHead] * tied,
               gpt.GPT]
    text = _cut(source_of(*objects), "        # Same arguments, same result: context "
                "parallelism puts ring attention here.\n")
    if not rope:
        text = _cut(text, '        self.rope_theta = config.rope_theta if config.position == '
                    '"rope" else None\n')
        text = _cut(text, "        if self.rope_theta is not None:\n            q, k = "
                    "rotary(q, self.rope_theta), rotary(k, self.rope_theta)\n")
    if config.kv_heads == config.n_heads:  # multi-head attention: no groups to split
        text = _multi_head(text)
    if config.position == "learned":  # the position embedding is always there
        text = _cut(text, '(nn.Embedding(config.seq_len, config.d_model)\n                    '
                    'if config.position == "learned" else None)', "nn.Embedding(config.seq_len, "
                    "config.d_model)")
    text = _cut(text, _MLP, "        self.mlp = SwiGLU(config)\n" if swiglu else _GELU)
    if config.norm == "layernorm":
        text = _cut(text, '    if config.norm == "rmsnorm":\n        return nn.RMSNorm('
                    'config.d_model, eps=1e-5)\n')
    if not tied:
        text = _cut(text, _HEAD, "        self.head = nn.Linear(config.d_model, "
                    "config.vocab_size, bias=False)\n")
    return text


def model_pieces(config, pipelined: bool) -> list[Piece]:
    """The config, the model's classes and (in a pipeline) the GPT's first stage piece."""
    family = config.name
    if family == "mlp":
        return [config_piece(config), Piece(source_of(mlp.MLP), _IMPORTS[family])]
    text = gpt_source(config)
    if pipelined:
        text += "\n\n\n" + source_of(GPTEmbedding)
    if config.position == "learned":
        if pipelined:
            text = _cut(text, "  # pos is None under rotary embeddings", "")
        text = text.replace("        if self.pos is not None:\n            x = x + self.pos(",
                            "        x = x + self.pos(")
    return [config_piece(config), Piece(text, _IMPORTS[family])]


def data_piece(config) -> Piece:
    return Piece(source_of(_DATA[config.name]), ("import torch",))


def tp_pieces(config, meta_model, plan, tp: int) -> Piece:
    """``apply_tp``: ``parallelize_module`` with the model's plan, a dict from module names
    to ``ColwiseParallel``/``RowwiseParallel`` (``labkit/models/*_split.py``)."""
    imports = ("from torch.distributed.tensor.parallel import ColwiseParallel, "
               "RowwiseParallel, parallelize_module",)
    if config.name == "gpt":
        styles = block_styles(meta_model.blocks[0])
        notes = {"attn.qkv": "the heads: each rank computes its own",
                 "attn.proj": "each rank's partial sum, all-reduced",
                 "mlp.0": "hidden units split", "mlp.2": "partial sums all-reduced",
                 "mlp.gate": "hidden units split", "mlp.up": "hidden units split",
                 "mlp.down": "partial sums all-reduced"}
        entries = "\n".join(f'            "{name}": {type(style).__name__}(),  # {notes[name]}'
                            for name, style in styles.items())
        reorder = block('''
            def heads_together(model: nn.Module, tp: int) -> None:
                """Reorder each fused qkv's rows [q; k; v] into [q_0 k_0 v_0; q_1 k_1 v_1; ...]:
                ColwiseParallel's even split by rows then gives tp rank r its heads' q, k, v."""
                with torch.no_grad():
                    for block in model.blocks:
                        qkv = block.attn.qkv
                        for tensor in [t for t in (qkv.weight, qkv.bias) if t is not None]:
                            order = torch.arange(tensor.shape[0]).view(3, tp, -1)
                            tensor.copy_(tensor[order.transpose(0, 1).reshape(-1)])
        ''')
        multi_head = config.kv_heads == config.n_heads
        call = "    heads_together(model, tp_mesh.size())\n" if multi_head else ""
        code = (f'def apply_tp(model: nn.Module, tp_mesh) -> None:\n'
                f'    """Megatron-LM\'s split of every block over tp_mesh (torchtitan\'s '
                f'apply_tp):\n    columns, then rows, one all-reduce per pair in forward."""\n'
                f"{call}"
                f"    for block in model.blocks:\n"
                f"        parallelize_module(block, tp_mesh, {{\n{entries}\n        }})")
        pieces = [reorder] if multi_head else []
        return pieces + [Piece(code, imports + ("from torch import nn",))]
    styles = plan.tp_styles(meta_model)
    entries = "\n".join(f'        "{name}": {type(style).__name__}(),' for name, style in
                        styles.items())
    code = (f'def apply_tp(model: nn.Module, tp_mesh) -> None:\n'
            f'    """Pairs of linears over tp_mesh: column-wise, then row-wise (no collective\n'
            f'    between the two, one all-reduce after the second)."""\n'
            f"    parallelize_module(model, tp_mesh, {{\n{entries}\n    }})")
    return [Piece(code, imports + ("from torch import nn",))]
