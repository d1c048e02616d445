"""talon_sd.attention: grouped-query attention computes what the models' own eager attention computes."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import DynamicCache, Gemma2Config, Gemma2ForCausalLM

from conftest import VOCAB, tiny_model
from talon_sd.lm import _cache_keyword, additive_mask


def gemma2():
    torch.manual_seed(5)
    config = Gemma2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=5,
                          query_pre_attn_scalar=16, attn_logit_softcapping=0.05)
    return Gemma2ForCausalLM(config).eval()


@torch.no_grad()
def logits(model, attention: str) -> list[torch.Tensor]:
    """A prompt's logits, then a step of three tree rows (rows 1 and 2 children of row 0) after it."""
    model = copy.deepcopy(model)
    model.config._attn_implementation = attention
    cache = {_cache_keyword(model): DynamicCache()}
    prompt = torch.tensor([[5, 17, 33, 8, 5, 17, 40, 41, 9, 3]])
    first = model(prompt, **cache, use_cache=True).logits
    ancestors = torch.tensor([[True, False, False], [True, True, False], [True, False, True]])  # [3, 3]
    visible = torch.cat([torch.ones(3, prompt.shape[1], dtype=torch.bool), ancestors], dim=1)  # [3, past + 3]
    mask = additive_mask(visible[None, None], first.dtype, first.device)  # [1, 1, 3, past + 3]
    positions = torch.tensor([[10, 11, 11]])
    step = model(torch.tensor([[12, 7, 30]]), **cache, attention_mask=mask, position_ids=positions,
                 use_cache=True).logits
    return [first, step]


@pytest.mark.parametrize("build", [lambda: tiny_model("llama"), lambda: tiny_model("qwen2"), gemma2],
                         ids=["llama", "qwen2", "gemma2-softcap"])
def test_grouped_attention_equals_eager_attention(build):
    model = build()
    for grouped, eager in zip(logits(model, "grouped"), logits(model, "eager")):
        torch.testing.assert_close(grouped, eager, rtol=1e-5, atol=1e-5)
