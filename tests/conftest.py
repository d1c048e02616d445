"""Tiny random models built from a config in the test itself (no download), and the plain-greedy oracle.

``TALON_TEST_DEVICE=cuda python -m pytest tests/test_oracle.py ...`` builds the tiny models on that device
(default cpu), so the losslessness tests run on a GPU unchanged where one is lent."""

from __future__ import annotations

import os

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from talon_sd import attention

VOCAB = 96
DEVICE = torch.device(os.environ.get("TALON_TEST_DEVICE", "cpu"))
ATTENTION = "grouped" if DEVICE.type == "cpu" else "sdpa"  # what models.load_model picks by default
attention.register()


def tiny_model(kind: str = "llama", seed: int = 0, vocab: int = VOCAB, layers: int = 2):
    """A float32 random causal LM small enough for hundreds of forwards per second."""
    torch.manual_seed(seed)
    common = dict(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        bos_token_id=0, eos_token_id=1, pad_token_id=2, tie_word_embeddings=False,
    )
    config = LlamaConfig(**common) if kind == "llama" else Qwen2Config(**common, use_sliding_window=False)
    config._attn_implementation = ATTENTION
    model = (LlamaForCausalLM if kind == "llama" else Qwen2ForCausalLM)(config)
    # Sharpen the output so that greedy continuations are structured (repeats, confident runs).
    with torch.no_grad():
        model.lm_head.weight.mul_(6.0)
    return model.eval().requires_grad_(False).to(DEVICE)


def noisy_copy(model, noise: float, seed: int = 1):
    """A draft that agrees with ``model`` often but not always: same weights plus Gaussian noise."""
    import copy

    draft = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in draft.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator).to(parameter.device) * noise * parameter.std())
    return draft


@torch.no_grad()
def plain_greedy(model, prompt: list[int], max_new_tokens: int, eos: int | None = None) -> list[int]:
    """The oracle: recompute the whole sequence every step, take the argmax (no cache, no tree)."""
    ids = list(prompt)
    out = []
    for _ in range(max_new_tokens):
        token = int(model(torch.tensor([ids], device=model.device)).logits[0, -1].argmax())
        out.append(token)
        ids.append(token)
        if eos is not None and token == eos:
            break
    return out


@pytest.fixture(scope="session")
def llama_pair():
    target = tiny_model("llama", seed=0)
    return target, noisy_copy(target, 0.15)


@pytest.fixture(scope="session")
def qwen_pair():
    target = tiny_model("qwen2", seed=5)
    return target, noisy_copy(target, 0.2, seed=6)
