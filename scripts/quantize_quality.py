"""What int8 and int4 weights cost in quality: perplexity on held text and agreement with the dequantized model.

For each ``--quantize`` setting (``none`` is the GGUF dequantized to ``--dtype``, the reference), loads the target
and reads, on the first turn of each dataset's first ``--limit`` prompts (chat template applied, at most
``--max-tokens`` tokens each):

* perplexity of the prompt text (teacher-forced, all positions after the first), pooled over prompts;
* top-1 agreement: the share of positions where the quantized model's argmax equals the reference's, on the
  reference's own greedy continuation of ``--new-tokens`` tokens (teacher-forced, so one disagreement does not
  change the text the rest is read on);
* the bytes of its linear weights.

    python scripts/quantize_quality.py --quantize none,int8,int4 --limit 3 --new-tokens 64
"""

from __future__ import annotations

import argparse
import math

import torch

from talon_sd import models
from talon_sd.bench.datasets import DATASETS, load_prompts
from talon_sd.bench.machine import machine_info


def weight_bytes(model) -> int:
    """Bytes of the model's linear weights (parameters and quantized buffers; embeddings and norms excluded)."""
    total = 0
    for module in model.modules():
        tensors = [t for name, t in module.named_buffers(recurse=False) if name in ("packed", "q", "scales_and_zeros",
                                                                                  "scale", "zero")]
        if isinstance(module, torch.nn.Linear):
            tensors.append(module.weight)
        total += sum(t.numel() * t.element_size() for t in tensors)
    return total


@torch.no_grad()
def read(model, sequences: list[tuple[torch.Tensor, int]]) -> tuple[float, list[torch.Tensor]]:
    """Mean negative log-likelihood over the prompt positions, and the argmax over each continuation."""
    nll, count, argmaxes = 0.0, 0, []
    for ids, prompt_length in sequences:  # ids [L]
        logits = model(ids[None]).logits[0].float()  # [L, vocab]
        log_probs = torch.log_softmax(logits[: prompt_length - 1], dim=-1)  # [P - 1, vocab]
        nll -= log_probs.gather(1, ids[1:prompt_length, None]).sum().item()
        count += prompt_length - 1
        argmaxes.append(logits[prompt_length - 1: -1].argmax(dim=-1))  # [new tokens]
    return nll / count, argmaxes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=models.DEFAULT_TARGET)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--quantize", default="none,int8,int4")
    parser.add_argument("--datasets", default=",".join(DATASETS))
    parser.add_argument("--limit", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parser.parse_args()
    settings = args.quantize.split(",")
    if settings[0] != "none":
        settings.insert(0, "none")
    info = machine_info()
    print(f"machine: {info['cpu']}, bf16 native: {info['bf16_native']}, torch {torch.__version__}, "
          f"{info['torch_threads']} threads; target {args.target}, dtype {args.dtype}")
    sequences, reference = None, None
    print("| quantize | linear weights | perplexity | / none | top-1 agreement with none |")
    print("|---|---|---|---|---|")
    for setting in settings:
        loaded = models.load_model(args.target, role="target", dtype=args.dtype, quantize=setting)
        if sequences is None:  # the reference's own greedy continuations
            sequences = []
            for prompt in load_prompts(args.datasets.split(","), args.limit):
                text = loaded.tokenizer.apply_chat_template([{"role": "user", "content": prompt.turns[0]}],
                                                            tokenize=False, add_generation_prompt=True)
                ids = loaded.tokenizer(text, return_tensors="pt").input_ids[0, -args.max_tokens:]  # [P]
                with torch.no_grad():
                    out = loaded.model.generate(ids[None], max_new_tokens=args.new_tokens, do_sample=False,
                                                min_new_tokens=args.new_tokens)[0]  # [P + new]
                sequences.append((out, ids.numel()))
        nll, argmaxes = read(loaded.model, sequences)
        if reference is None:
            reference = (nll, argmaxes)
        agree = sum(int((a == b).sum()) for a, b in zip(argmaxes, reference[1]))
        total = sum(a.numel() for a in argmaxes)
        print(f"| {setting} | {weight_bytes(loaded.model) / 2**20:.0f} MiB | {math.exp(nll):.3f} | "
              f"{math.exp(nll - reference[0]):.4f} | {agree / total:.1%} ({agree}/{total}) |", flush=True)
        del loaded
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
