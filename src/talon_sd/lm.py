"""The one boundary to Hugging Face models: a causal LM with its own KV cache.

Tree attention reaches the model only through the forward call's public arguments: ``input_ids``,
``position_ids``, a 4-D additive ``attention_mask`` ``[1, 1, T, past + T]`` and a ``DynamicCache``
(no copied modeling files, no patched attention). Cache layout while verifying a tree of N nodes::

    cache rows:  [ committed tokens except the root (past) | root n1 n2 ... n(N-1) ]
                                                              ^ tree nodes, index order
    after acceptance of the path root -> n2 -> n5:
                 [ committed tokens except the root | root n2 n5 ]      (one gather per tensor)
"""

from __future__ import annotations


import torch
from transformers import DynamicCache


class KVCache:
    """A ``DynamicCache`` with the verbs the decoding loop needs."""

    def __init__(self, model) -> None:
        self.model_config = model.config
        self.reset()

    def reset(self) -> None:
        self.cache = DynamicCache(config=self.model_config)

    @property
    def length(self) -> int:
        return self.cache.get_seq_length()

    def crop(self, length: int) -> None:
        """Keep the first ``length`` rows."""
        if length < self.length:
            self.cache.crop(length - self.length)

    @torch.inference_mode()
    def keep(self, start: int, offsets: torch.Tensor) -> None:
        """Keep rows ``[:start]`` followed by rows ``start + offsets`` [K] (ascending), dropping the rest.

        Compaction of an accepted tree path: one gather and one copy per key/value tensor.
        """
        offsets = offsets.to(torch.long)
        count = int(offsets.numel())
        if count and not bool((offsets == torch.arange(count, device=offsets.device)).all()):
            rows = offsets + start
            for layer in self.cache.layers:
                rows = rows.to(layer.keys.device)
                layer.keys[..., start : start + count, :] = layer.keys.index_select(-2, rows)
                layer.values[..., start : start + count, :] = layer.values.index_select(-2, rows)
        self.crop(start + count)


class CausalLM:
    """A Hugging Face causal LM plus its KV cache; every model call of the library goes through here."""

    def __init__(self, model) -> None:
        self.model = model
        self.cache = KVCache(model)
        embeddings = model.get_input_embeddings()
        self.vocab_size = int(embeddings.weight.shape[0])
        self.device = embeddings.weight.device
        self.dtype = embeddings.weight.dtype
        self.max_positions = int(getattr(model.config, "max_position_embeddings", 0) or 1 << 30)

    def reset(self) -> None:
        self.cache.reset()

    @torch.inference_mode()
    def forward(
        self,
        tokens: torch.Tensor,  # [T] int64
        positions: torch.Tensor | None = None,  # [T] absolute positions; default: continue the cache
        visible: torch.Tensor | None = None,  # [T, past + T] bool; default: causal
        last_only: bool = False,
    ) -> torch.Tensor:
        """Append ``tokens`` to the cache and return float32 logits ``[T, V]`` (``[1, V]`` if last_only)."""
        past = self.cache.length
        count = int(tokens.shape[0])
        if positions is None:
            positions = torch.arange(past, past + count, device=self.device)
        kwargs = {}
        if visible is not None:
            bias = torch.zeros(visible.shape, dtype=self.dtype, device=self.device)
            bias.masked_fill_(~visible.to(self.device), torch.finfo(self.dtype).min)
            kwargs["attention_mask"] = bias[None, None]  # [1, 1, T, past + T]
        output = self.model(
            input_ids=tokens.to(self.device)[None],
            position_ids=positions.to(self.device)[None],
            past_key_values=self.cache.cache,
            use_cache=True,
            **kwargs,
        )
        # (logits_to_keep=1 is avoided on purpose: with T > 1 it made bf16 CPU forwards ~6x slower)
        logits = output.logits[0, -1:] if last_only else output.logits[0]
        logits = logits.float()  # [T or 1, V]
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return logits

    @torch.inference_mode()
    def prefill(self, tokens: torch.Tensor) -> None:
        """Reset the cache and fill it with ``tokens`` [L]. No logits are needed, so only the decoder
        stack runs (the output head over a long prompt would cost L x vocab for nothing)."""
        self.reset()
        if not tokens.numel():
            return
        decoder = self.model.get_decoder() if hasattr(self.model, "get_decoder") else None
        if decoder is None:
            self.forward(tokens, last_only=True)
            return
        decoder(input_ids=tokens.to(self.device)[None], past_key_values=self.cache.cache, use_cache=True)

    def forward_tree(self, tree) -> torch.Tensor:
        """Verify a :class:`DraftTree` whose root follows the cache: logits ``[N, V]``, one per node."""
        past = self.cache.length
        return self.forward(tree.tokens, past + tree.positions, tree.visibility(past))
