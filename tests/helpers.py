"""Small shared helpers for tests: run the decoding loop directly on in-memory models."""

from __future__ import annotations

import torch

from talon_sd.builders import make_builder
from talon_sd.config import SamplingConfig, TreeConfig
from talon_sd.decoding import Pipeline, StopCondition, decode
from talon_sd.drafters import ModelDrafter, NgramDrafter
from talon_sd.lm import CausalLM
from talon_sd.stats import DecodeStats


def make_drafter(kind: str, draft_model, vocab: int):
    return ModelDrafter(draft_model) if kind == "model" else NgramDrafter(vocab)


def run(target_model, drafter, tree: TreeConfig, prompt, max_new_tokens, eos=(), sampling=None):
    """Decode with the real loop; returns (tokens, stats)."""
    stats = DecodeStats(method=tree.label)
    pipeline = Pipeline(CausalLM(target_model), None if tree.method == "ar" else drafter, make_builder(tree),
                        sampling or SamplingConfig())
    stop = StopCondition(max_new_tokens=max_new_tokens, eos_token_ids=frozenset(eos))
    tokens = list(decode(pipeline, torch.tensor(prompt), stop, stats))
    return tokens, stats
