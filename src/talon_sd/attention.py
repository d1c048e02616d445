"""Grouped-query attention for CPU decoding: ``attn_implementation="grouped"``.

A decoding step attends a few query rows (one token, or a tree of N) to a long cache. On CPU, PyTorch's fused
``scaled_dot_product_attention`` is slow there in bfloat16 (EPYC AVX512-BF16, 2 threads, 12 query and 2 key/value
heads of 128, one query row: 0.39 ms at 230 cached rows and 1.16 ms at 900, against 0.17 and 0.14 ms for the two
matmuls below; a tie at 16 rows and in float32; ``python scripts/matmul_paths.py``). Over 28 layers, an int4 step
of the 1.5B target at 800 cached rows took 79.9 ms against 101.7 ms. This is attention as the models' own
eager code writes it (scores, an additive mask, a float32 softmax, values), with one change: each key/value head
serves its group of query heads through one matmul, so keys and values are never repeated per query head::

    query [b, H, q, d] -> [b, KV, H/KV * q, d]    scores = query @ key^T    [b, KV, H/KV * q, L]

Registered with transformers under the name ``grouped`` (:func:`register`; its masks are eager's, additive),
so a model loaded with it takes the tree mask of :mod:`talon_sd.lm` as it takes eager's. ``models.load_model``
uses it on CPU by default; CUDA keeps ``sdpa``.
"""

from __future__ import annotations

import torch

NAME = "grouped"


def grouped_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, softcap=None,
                              **kwargs):
    """One attention layer: query [b, H, q, d], key/value [b, KV, L, d], an additive (or boolean: True = visible)
    ``attention_mask`` broadcastable to [b, 1, q, L] or None (every key visible). Returns ([b, q, H, d], None),
    the contract of transformers' attention functions. ``softcap`` as Gemma 2 uses it; dropout is not applied
    (inference only)."""
    if kwargs.get("s_aux") is not None:
        raise NotImplementedError("grouped attention: attention sinks (s_aux) are not supported; load the model "
                                  "with attn_implementation='eager'")
    batch, heads, rows, head_dim = query.shape
    kv_heads, length = key.shape[1], key.shape[2]
    group = heads // kv_heads
    scaling = head_dim ** -0.5 if scaling is None else scaling
    grouped = query.reshape(batch, kv_heads, group * rows, head_dim)  # heads of one group are adjacent
    scores = torch.matmul(grouped, key.transpose(2, 3)).view(batch, kv_heads, group, rows, length)
    scores = scores.float() * scaling  # [b, KV, H/KV, q, L]
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if attention_mask is not None:
        mask = attention_mask[..., :length]  # [b, 1 or H, q, L]
        if mask.shape[1] == heads and heads > 1:
            mask = mask.reshape(batch, kv_heads, group, rows, length)
        else:
            mask = mask.unsqueeze(1)  # [b, 1, 1, q, L]
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        else:
            scores = scores + mask.float()
    weights = torch.softmax(scores, dim=-1).to(value.dtype).view(batch, kv_heads, group * rows, length)
    output = torch.matmul(weights, value).view(batch, heads, rows, head_dim)  # [b, H, q, d]
    return output.transpose(1, 2).contiguous(), None


def register() -> None:
    """Make ``attn_implementation="grouped"`` known to transformers (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask

    AttentionInterface.register(NAME, grouped_attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, eager_mask)
