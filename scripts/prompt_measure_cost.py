"""What measuring a prompt's agreement costs on this machine (design 29 of :mod:`talon_sd.control`), by part.

The decoding loop measures a prompt (:func:`talon_sd.decoding._prefill`) with the target's prefill plus its output
head over :func:`talon_sd.decoding.agreement_positions` (up to 64 rows), the draft's prompt forward (decoder stack),
and the draft's output head over the same rows. The draft's forward is what the request's first drafted step would
run anyway (its catch-up); the two heads are the measurement's own price, and the whole draft forward is lost only
when the request then runs every step plain. This script times each part on random token ids (the cost does not
depend on them) for prompts of ``--lengths`` tokens, interleaved, median of ``--repeats`` after one untimed round,
next to one plain decoding step (a one-token target forward over the same cache), and prints a table with the
machine in its first line. Each output head is timed on its own over the kept hidden states (a difference of two
prefills would drown it in their noise).

    python scripts/prompt_measure_cost.py --dtype float32 [--cpu-kernels auto] [--draft-quantization auto]
        [--lengths 39,51,134,709]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from talon_sd import SpeculativeGenerator
from talon_sd.bench.machine import machine_info
from talon_sd.config import CPU_KERNELS, DRAFT_QUANTIZATION
from talon_sd.decoding import agreement_positions
from talon_sd.drafters.model import ModelDrafter


def _seconds(function) -> float:
    started = time.perf_counter()
    function()
    return time.perf_counter() - started


def measure(generator: SpeculativeGenerator, length: int) -> dict[str, float]:
    """One round of every part for a prompt of ``length`` tokens (the context is the prompt but its last token)."""
    target, drafter = generator.target, ModelDrafter(generator.draft, generator.target.vocab_size)
    prompt = torch.randint(100, 20000, (length,))  # [L]
    context, at = prompt[:-1], agreement_positions(length - 1)  # [L - 1], [K]
    parts = {"target prefill": _seconds(lambda: target.prefill(context))}
    states = target.prefill_states(context)  # [L - 1, H]: the same forward, its last hidden states kept
    parts["target head"] = _seconds(lambda: target.head_logits(states[at]))  # what prefill_logits adds
    parts["plain step"] = _seconds(lambda: target.forward(prompt[-1:]))  # continues the cache
    drafter.start(prompt, None)
    parts["draft forward"] = _seconds(drafter.catch_up)
    parts["draft head"] = _seconds(lambda: drafter.prompt_logits(at))
    parts["rows"] = float(at.numel())
    return parts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--cpu-kernels", default="auto", choices=CPU_KERNELS)
    parser.add_argument("--draft-quantization", default="auto", choices=DRAFT_QUANTIZATION)
    parser.add_argument("--lengths", default="39,51,134,709", help="comma-separated prompt lengths in tokens")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default=None)
    args = parser.parse_args()
    lengths = [int(value) for value in args.lengths.split(",")]
    if any(length < 2 for length in lengths) or args.repeats < 1:
        parser.error("--lengths: integers >= 2; --repeats: an integer >= 1")
    info = machine_info()
    print(f"machine: {info['cpu']}, bf16 native: {info['bf16_native']}, GPU: {info['cuda'] or 'none'}, "
          f"torch {torch.__version__}, {info['torch_threads']} threads, load average {info['load_average']}; "
          f"{args.dtype}, cpu kernels {args.cpu_kernels}")
    generator = SpeculativeGenerator(dtype=args.dtype, device=args.device, cpu_kernels=args.cpu_kernels,
                                     draft_quantization=args.draft_quantization)
    print(f"cpu kernels (what ran): {generator.cpu_kernels}")
    rounds: dict[int, list[dict[str, float]]] = {length: [] for length in lengths}
    for repeat in range(args.repeats + 1):  # round 0 is untimed
        for length in lengths:
            parts = measure(generator, length)
            if repeat:
                rounds[length].append(parts)
    print("| prompt tokens | rows | target prefill s | target head s | draft forward s | draft head s | heads s | "
          "all extra s | plain step s | heads in plain steps | all extra in plain steps |")
    print("|" + "---|" * 11)
    for length in lengths:
        median = {key: statistics.median(parts[key] for parts in rounds[length]) for key in rounds[length][0]}
        head_target = median["target head"]
        heads = head_target + median["draft head"]
        extra = heads + median["draft forward"]
        step = median["plain step"]
        print(f"| {length} | {median['rows']:.0f} | {median['target prefill']:.3f} | {head_target:.3f} | "
              f"{median['draft forward']:.3f} | {median['draft head']:.3f} | {heads:.3f} | {extra:.3f} | {step:.3f} | "
              f"{heads / step:.2f} | {extra / step:.2f} |", flush=True)


if __name__ == "__main__":
    main()
