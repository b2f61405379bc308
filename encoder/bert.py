"""BERT-family encoders (BERT, MiniLM, ...) for inference in plain PyTorch, without transformers.

Importing transformers 5 imports much of PyTorch beyond ``import torch`` (``torch._dynamo``,
``torch.distributed.tensor``, sympy, scipy) and scans its model folders: on a 2-core machine
it took longer than ``import torch`` itself, and a text query from the command line paid it
before encoding six words. A BERT encoder is small enough to write out: the modules below carry
transformers' ``BertModel`` names and parameters (``encoder.layer.0.attention.self.query``, ...),
so its safetensors file loads as it is, a query tower's LoRA deltas merge by the same module names
(encoder/tower.py), and the oneDNN fusion finds ``dense`` + ``intermediate_act_fn`` as in
transformers' model (encoder/fused.py). The tokenizer is the folder's ``tokenizer.json``, read by
the ``tokenizers`` library that transformers' fast tokenizer wraps.

:func:`load` answers None for anything it does not cover (another architecture, relative position
embeddings, an approximate GELU, sharded or pickled weights, no ``tokenizer.json``, parameters
under other names), and :class:`~.model.Encoder` then loads the model through transformers.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

WEIGHTS = "model.safetensors"
MAX_JSON_BYTES = 1 << 20  # config.json and tokenizer_config.json (tokenizer.json goes to the tokenizers library)


class _SelfAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.heads, self.head_dim = c.num_attention_heads, c.hidden_size // c.num_attention_heads
        self.query, self.key, self.value = (nn.Linear(c.hidden_size, c.hidden_size) for _ in range(3))

    def forward(self, x, bias):
        b, w, _ = x.shape
        q, k, v = (m(x).view(b, w, self.heads, self.head_dim).transpose(1, 2) for m in (self.query, self.key, self.value))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=self.head_dim ** -0.5)  # (b, heads, w, d)
        return out.transpose(1, 2).reshape(b, w, -1)


class _Output(nn.Module):
    """dense, then LayerNorm of (dense + the residual): BertSelfOutput and BertOutput alike."""

    def __init__(self, c, width: int):
        super().__init__()
        self.dense = nn.Linear(width, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def forward(self, x, residual):
        return self.LayerNorm(self.dense(x) + residual)


class _Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.self, self.output = _SelfAttention(c), _Output(c, c.hidden_size)

    def forward(self, x, bias):
        return self.output(self.self(x, bias), x)


class _Intermediate(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.intermediate_size)
        self.intermediate_act_fn = nn.GELU()  # exact (erf) GELU: config hidden_act "gelu"

    def forward(self, x):
        return self.intermediate_act_fn(self.dense(x))


class _Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.attention, self.intermediate, self.output = _Attention(c), _Intermediate(c), _Output(c, c.intermediate_size)

    def forward(self, x, bias):
        x = self.attention(x, bias)
        return self.output(self.intermediate(x), x)


class _Encoder(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.layer = nn.ModuleList(_Layer(c) for _ in range(c.num_hidden_layers))


class _Embeddings(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.word_embeddings = nn.Embedding(c.vocab_size, c.hidden_size)
        self.position_embeddings = nn.Embedding(c.max_position_embeddings, c.hidden_size)
        self.token_type_embeddings = nn.Embedding(c.type_vocab_size, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def forward(self, input_ids, position_ids):
        # token type 0 throughout, as transformers' BertModel assumes when none are given
        x = self.word_embeddings(input_ids) + self.token_type_embeddings.weight[0]
        return self.LayerNorm(x + self.position_embeddings(position_ids))


class _Pooler(nn.Module):  # held for its parameters only: relsearch pools the hidden states itself
    def __init__(self, c):
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.hidden_size)


class BertModel(nn.Module):
    """transformers' ``BertModel`` forward for inference: ``model(input_ids=(b, w), attention_mask=
    (b, w) 0/1 or an additive (b, 1, w, w) bias, position_ids=(b, w) or None).last_hidden_state``
    (b, w, hidden). ``config``: the folder's config.json as attributes."""

    def __init__(self, config: SimpleNamespace, *, pooler: bool):
        super().__init__()
        self.config = config
        self.embeddings, self.encoder = _Embeddings(config), _Encoder(config)
        self.pooler = _Pooler(config) if pooler else None

    @property
    def dtype(self) -> torch.dtype:
        return self.embeddings.word_embeddings.weight.dtype

    def forward(self, *, input_ids, attention_mask, position_ids=None) -> SimpleNamespace:
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1], device=input_ids.device)[None]
        x = self.embeddings(input_ids, position_ids)
        bias = attention_mask
        if attention_mask.dim() == 2:  # padding: (b, w) 1 = a token → (b, 1, 1, w) additive bias
            bias = (None if bool(attention_mask.all()) else
                    torch.zeros(attention_mask.shape, dtype=x.dtype, device=x.device)
                    .masked_fill_(attention_mask == 0, torch.finfo(x.dtype).min)[:, None, None, :])
        for layer in self.encoder.layer:
            x = layer(x, bias)
        return SimpleNamespace(last_hidden_state=x)


class Tokenizer(SimpleNamespace):
    """What :class:`~.batching.Tokenize` and :class:`~.model.Encoder` read of a transformers fast
    tokenizer: ``_tokenizer`` (the ``tokenizers`` object), ``is_fast``, ``pad_token_id`` and
    ``model_max_length``."""


def _json(path: Path):
    from ..files import read_regular_file

    try:  # an unreadable file: None, and transformers, loading the folder instead, says what is wrong with it
        return json.loads(read_regular_file(path, limit=MAX_JSON_BYTES, what=str(path))) if path.is_file() else None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError, ValueError):
        return None


def _covered(config) -> bool:
    """Whether :class:`BertModel` computes what transformers computes for ``config``."""
    return (isinstance(config, dict) and config.get("model_type") == "bert" and config.get("hidden_act") == "gelu"
            and config.get("position_embedding_type", "absolute") == "absolute"
            and not config.get("is_decoder") and not config.get("add_cross_attention")
            and all(isinstance(config.get(k), int) and config[k] > 0 for k in (
                "hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size", "vocab_size",
                "max_position_embeddings", "type_vocab_size"))
            and config["hidden_size"] % config["num_attention_heads"] == 0
            and isinstance(config.get("layer_norm_eps", 1e-12), float))


def plain_config(folder: str) -> SimpleNamespace | None:
    """The config.json of the model folder ``folder`` as attributes when :func:`load` may cover it
    (a BERT it computes exactly, one safetensors file, a ``tokenizer.json``); None otherwise."""
    root = Path(folder)
    if not root.is_dir() or not (root / "tokenizer.json").is_file() or [p.name for p in root.glob("*.safetensors")] != [WEIGHTS]:
        return None
    config = _json(root / "config.json")
    return SimpleNamespace(**{"layer_norm_eps": 1e-12, **config}) if _covered(config) else None


def load(folder: str, config: SimpleNamespace, dtype: torch.dtype) -> tuple[BertModel, Tokenizer] | None:
    """(model in ``dtype``, in eval mode, on the CPU; tokenizer) of the model folder ``folder`` of
    :func:`plain_config` ``config``, or None when its weights are not those of such a model (the
    caller loads it through transformers). A weights file that is not safetensors raises
    safetensors' ``SafetensorError``, as transformers' loading does."""
    root = Path(folder)
    tok_config = _json(root / "tokenizer_config.json") or {}
    if not isinstance(tok_config, dict):
        return None
    from safetensors.torch import load_file
    from tokenizers import Tokenizer as FastTokenizer

    state = {k.removeprefix("bert."): v for k, v in load_file(root / WEIGHTS).items()}
    state.pop("embeddings.position_ids", None)  # a buffer older transformers saved: positions are counted here
    # built on the CPU, its random initialisation then replaced: under torch.device("meta") the
    # initialisers import torch._dynamo, 2 s of a query's start on a 2-core machine
    model = BertModel(config, pooler="pooler.dense.weight" in state)
    if set(state) != set(model.state_dict()) or any(state[k].shape != p.shape for k, p in model.state_dict().items()):
        return None
    model.load_state_dict(state, assign=True)
    model = model.to(dtype).eval()
    fast = FastTokenizer.from_file(str(root / "tokenizer.json"))
    pad = tok_config.get("pad_token", "[PAD]")
    pad_id = fast.token_to_id(pad.get("content") if isinstance(pad, dict) else str(pad))
    longest = tok_config.get("model_max_length")
    tokenizer = Tokenizer(_tokenizer=fast, is_fast=True, pad_token_id=pad_id if pad_id is not None else 0,
                          model_max_length=longest if isinstance(longest, int) and longest > 0 else math.inf)
    return model, tokenizer
