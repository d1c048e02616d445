"""Batched generation with the target through Hugging Face ``model.generate`` (left padding).

Used twice by the data stage: to sample requests (Magpie) and to answer prompts. Every sampling
option is set explicitly, so the model's own ``generation_config`` (Qwen ships temperature 0.7,
top_p 0.8, top_k 20, repetition_penalty 1.1 in many releases) never leaks in: temperature 0 is plain
greedy, exactly what ``talon generate`` verifies against.

``logits_to_keep=0`` (logits of every input position) is passed on purpose: ``generate``'s default of
1 made bf16 CPU forwards of Qwen2.5-Coder-1.5B several times slower here (a batch-8 decode step 0.37 s
against 0.09 s greedy, the prefill ~5x; the same effect as noted in :mod:`talon_sd.lm`). The price is
the prefill's full logits ``[B, T, V]``, which :data:`MAX_PREFILL_TOKENS` bounds for the callers.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch

MAX_PREFILL_TOKENS = 4096  # padded prompt tokens per generate call (the prefill's logits: 1.2 GB at V = 152k, bf16)


@dataclass(frozen=True)
class Completion:
    """One generated continuation: ``tokens`` up to and including the first stop id, if any."""

    tokens: tuple[int, ...]
    finished: bool  # ended with a stop id (False: cut at max_new_tokens)


def stop_token_ids(model, tokenizer) -> tuple[int, ...]:
    """The ids that end a turn: the generation config's eos ids and the tokenizer's eos id."""
    ids = set()
    for source in (getattr(model.generation_config, "eos_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif source is not None:
            ids.update(int(i) for i in source)
    return tuple(sorted(ids))


def pad_token_id(tokenizer, stop_ids: tuple[int, ...]) -> int:
    """The tokenizer's pad id, else its first stop id (padding is masked out either way)."""
    pad = getattr(tokenizer, "pad_token_id", None)
    return int(pad) if pad is not None else int(stop_ids[0] if stop_ids else 0)


@torch.inference_mode()
def generate_batch(
    model,
    prompts: list[list[int]],
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    stop_ids: tuple[int, ...],
    pad_id: int,
    seed: int,
) -> list[Completion]:
    """Continue every prompt (token ids) in one left-padded ``generate`` call.

    ``temperature`` 0 is greedy; otherwise sampling with ``top_p`` (the torch RNG is seeded with
    ``seed`` first, so a resumed run draws the same batch again)."""
    from transformers import GenerationConfig

    width = max(len(prompt) for prompt in prompts)
    device = model.get_input_embeddings().weight.device
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)  # [B, width]
    attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)  # [B, width]
    for row, prompt in enumerate(prompts):
        input_ids[row, width - len(prompt):] = torch.tensor(prompt)
        attention_mask[row, width - len(prompt):] = 1
    sampling = temperature > 0
    config = GenerationConfig(
        max_new_tokens=max_new_tokens, do_sample=sampling, temperature=temperature if sampling else 1.0,
        top_p=top_p if sampling else 1.0, top_k=0, repetition_penalty=1.0, num_beams=1,
        eos_token_id=list(stop_ids) or None, pad_token_id=pad_id,
    )
    torch.manual_seed(seed)
    keep_all = {"logits_to_keep": 0} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
    output = model.generate(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                            generation_config=config, **keep_all)  # [B, width + new]
    completions = []
    for row in output[:, width:].tolist():
        cut = next((i for i, token in enumerate(row) if token in stop_ids), None)
        tokens = row if cut is None else row[: cut + 1]
        completions.append(Completion(tuple(tokens), cut is not None))
    return completions
