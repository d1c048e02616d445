"""A lean forward for Llama-family decoders on CPU: transformers' arithmetic, op for op, without its per-call overhead.

A one-token step of the 1.5B int4 target runs 197 linears in about 40 ms of kernels; through transformers' modules
the step took about 60-75 ms. The rest is Python: ~430 module calls, their hooks and wrappers, the mask builders, the
output records, ~5,000 small tensor ops. This forward does what ``Qwen2DecoderLayer`` / ``LlamaDecoderLayer`` do
(RMSNorm, rotary embedding, grouped attention as :mod:`talon_sd.attention` writes it, SiLU MLP, residuals) in the
same order and dtypes, calling the model's own projection modules (the quantized linears' kernels directly,
:meth:`talon_sd.quantize._WeightOnlyLinear.rows`), its embedding, rotary module, final norm weight and output head,
and writing keys and values through the ``DynamicCache``'s own ``update``, so the cache is the one the
transformers forward would leave. Logits, cache rows and captured features equal transformers' bit for bit on the
tiny test models (float32 and bfloat16; dense, oneDNN-packed, dynamic int8 and native int4 / int8 linears) and
logits on the packaged pair (``scripts/lean_decoder.py`` checks). This is the one place the library writes a model's
decoder layer itself (the house rule is no copied modeling files): the bit-for-bit tests guard it against
transformers upgrades. Measured on the packaged pair, AMD EPYC (AVX2), 2 threads, float32 activations with int4 weights,
one-token steps at 200 cached rows alternated with transformers' forward (``python scripts/lean_decoder.py``; figures
in docs/BENCHMARKS.md section 6).

Used by :class:`talon_sd.lm.CausalLM` for models it knows exactly (:meth:`LeanDecoder.of`): ``LlamaForCausalLM``,
``Qwen2ForCausalLM`` and ``MistralForCausalLM`` with SiLU MLPs, full attention in every layer and the ``grouped``
attention (the CPU default; any device). Anything else (CUDA's ``sdpa``, sliding windows, other architectures, the batched
engine) runs transformers' forward as before.
"""

from __future__ import annotations

import torch

from .quantize import _WeightOnlyLinear

ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM")


class LeanDecoder:
    """The decoder stack and output head of one model, called as :meth:`forward`."""

    def __init__(self, model) -> None:
        self.model = model
        self.layers = [_Layer(layer) for layer in model.model.layers]
        self.eps = float(model.model.norm.variance_epsilon)

    @classmethod
    def of(cls, model) -> LeanDecoder | None:
        """A lean decoder for ``model``, or None where it is not one this module reproduces exactly. Decided and
        the projections taken when called: replace or quantize a model's linears before making its ``CausalLM``."""
        config = model.config
        layers = getattr(getattr(model, "model", None), "layers", None)
        sliding = (any(kind != "full_attention" for kind in (getattr(config, "layer_types", None) or ()))
                   or (getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True)))
        if (type(model).__name__ not in ARCHITECTURES or layers is None or sliding
                or getattr(config, "_attn_implementation", None) != "grouped"
                or getattr(config, "hidden_act", None) != "silu"):
            return None
        return cls(model)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, cache, mask: torch.Tensor | None,
                logits: bool = True, capture: tuple[int, ...] = ()):
        """Append ``tokens`` [T] at ``positions`` [T] to ``cache`` (a ``DynamicCache`` of P rows) and return
        ``(logits, features)``: float32 logits of every row [T, V] (the head runs on all rows, as transformers'
        does: a matmul of one row can round differently), or None without ``logits`` (a prefill); ``features``
        [T, H * len(capture)] the residual stream entering each
        layer of ``capture`` in its order (transformers' ``hidden_states[i]``, i < layers), or None. ``mask``: additive
        [T, P + T] (0 = visible, the dtype's lowest value elsewhere; :func:`talon_sd.lm.additive_mask`), None where
        every row sees every key (one token after the cache)."""
        hidden = self.model.model.embed_tokens(tokens)  # [T, H]
        cos, sin = self.model.model.rotary_emb(hidden[None], positions[None])  # [1, T, d] each
        rotary = cos[0][:, None, :], sin[0][:, None, :]  # [T, 1, d]: every head alike
        entering = {}  # layer index -> [T, H]
        for index, layer in enumerate(self.layers):
            if index in capture:
                entering[index] = hidden
            hidden = layer.forward(hidden, rotary, cache, index, mask)
        features = torch.cat([entering[index] for index in capture], dim=-1) if capture else None
        if not logits:
            return None, features
        return self.model.lm_head(_rms_norm(hidden, self.model.model.norm.weight, self.eps)).float(), features


class _Layer:
    """One decoder layer's weights and calls (``Qwen2DecoderLayer.forward`` / ``LlamaDecoderLayer.forward``)."""

    def __init__(self, layer) -> None:
        attention, mlp = layer.self_attn, layer.mlp
        self.input_norm, self.post_norm = layer.input_layernorm.weight, layer.post_attention_layernorm.weight
        self.eps = float(layer.input_layernorm.variance_epsilon)
        self.head_dim, self.scaling = int(attention.head_dim), float(attention.scaling)
        self.query, self.key, self.value, self.output = (_rows_of(attention.q_proj), _rows_of(attention.k_proj),
                                                         _rows_of(attention.v_proj), _rows_of(attention.o_proj))
        self.gate, self.up, self.down = _rows_of(mlp.gate_proj), _rows_of(mlp.up_proj), _rows_of(mlp.down_proj)

    def forward(self, hidden: torch.Tensor, rotary, cache, index: int, mask: torch.Tensor | None) -> torch.Tensor:
        count, d = hidden.shape[0], self.head_dim
        x = _rms_norm(hidden, self.input_norm, self.eps)  # [T, H]
        query = self.query(x).view(count, -1, d)  # [T, heads, d]
        key = self.key(x).view(count, -1, d)  # [T, kv heads, d]
        value = self.value(x).view(count, -1, d)
        query, key = _rotate(query, *rotary), _rotate(key, *rotary)
        keys, values = cache.update(key.transpose(0, 1)[None], value.transpose(0, 1)[None], index)  # [1, KV, L, d]
        hidden = hidden + self.output(_attention(query, keys[0], values[0], mask, self.scaling))
        x = _rms_norm(hidden, self.post_norm, self.eps)
        return hidden + self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))


def _rows_of(module):
    """[T, in] -> [T, out]: a native quantized linear's kernel directly (float32 in and out), else the module."""
    return module.rows if isinstance(module, _WeightOnlyLinear) and module.native else module


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``Qwen2RMSNorm`` / ``LlamaRMSNorm``: normalized in float32, scaled in the input's dtype."""
    x32 = x.to(torch.float32)
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x [T, heads, d] (``apply_rotary_pos_emb``: the halves rotated, not interleaved)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def _attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None,
               scaling: float) -> torch.Tensor:
    """query [T, heads, d], keys/values [KV, L, d], an additive mask [T, L] or None -> [T, heads * d], as
    :func:`talon_sd.attention.grouped_attention_forward` computes it (each key/value head serves its query heads
    through one matmul)."""
    count, heads, d = query.shape
    kv_heads, length = keys.shape[0], keys.shape[1]
    group = heads // kv_heads
    grouped = query.permute(1, 0, 2).reshape(kv_heads, group * count, d)  # [KV, group * T, d]
    scores = torch.matmul(grouped, keys.transpose(1, 2)).view(kv_heads, group, count, length)
    scores = scores.float() * scaling  # [KV, group, T, L]
    if mask is not None:
        scores = scores + mask.float()
    weights = torch.softmax(scores, dim=-1).to(values.dtype).view(kv_heads, group * count, length)
    output = torch.matmul(weights, values).view(heads, count, d)  # [heads, T, d]
    return output.transpose(0, 1).reshape(count, heads * d)
