"""The lean decoder against transformers' forward on the packaged pair: per-forward time, alternated in one process.

For the target and the draft LM, prefills each of ``--contexts`` random tokens and times a forward of T tokens (T = 1, a
plain step or a draft expansion; larger T, a tree verify with a causal mask) through :mod:`talon_sd.decoder` and
through transformers' modules, alternating the two ``--pairs`` times on the same cache (each forward's rows are
cropped again), and prints median milliseconds, the median of the per-pair ratios and whether the two forwards'
logits were identical, with the machine.

    python scripts/lean_decoder.py [--quantize int4] [--dtype auto] [--contexts 200,800] [--sizes 1,8] [--pairs 20]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from talon_sd import SpeculativeGenerator
from talon_sd.bench.machine import machine_info
from talon_sd.lm import CausalLM


def _seconds(lm: CausalLM, tokens: torch.Tensor) -> float:
    start = time.perf_counter()
    lm.forward(tokens)
    elapsed = time.perf_counter() - start
    lm.cache.crop(lm.cache.length - int(tokens.numel()))
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quantize", default="int4", help="none, int8 or int4 (target and draft LM)")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--contexts", default="200,800")
    parser.add_argument("--sizes", default="1,8")
    parser.add_argument("--pairs", type=int, default=20)
    args = parser.parse_args()
    info = machine_info()
    generator = SpeculativeGenerator(dtype=args.dtype, quantize=args.quantize)
    models = {"target": generator.target, "draft": CausalLM(generator.draft_model, role="draft")}
    print(f"machine: {info['cpu']}, bf16 native: {info['bf16_native']}, torch {torch.__version__}, "
          f"{info['torch_threads']} threads; dtype {generator.target.dtype}, quantize {args.quantize}")
    print("| model | cached rows | T | transformers ms | lean ms | lean / transformers (median of pairs) | same logits |")
    print("|---|---|---|---|---|---|---|")
    generator_seed = torch.Generator().manual_seed(0)
    for name, lm in models.items():
        lean = lm.lean
        if lean is None:
            print(f"| {name} | - | - | - | - | no lean decoder for this model | - |")
            continue
        for context in map(int, args.contexts.split(",")):
            lm.prefill(torch.randint(100, 20000, (context,), generator=generator_seed))
            for size in map(int, args.sizes.split(",")):
                tokens = torch.randint(100, 20000, (size,), generator=generator_seed)
                logits = {}
                for which in ("lean", "transformers"):
                    lm.lean = lean if which == "lean" else None
                    logits[which] = lm.forward(tokens)
                    lm.cache.crop(context)
                same = "yes" if torch.equal(logits["lean"], logits["transformers"]) else "NO"
                timings = {"transformers": [], "lean": []}
                for pair in range(args.pairs + 2):  # the first two pairs warm up
                    for which in (("lean", "transformers") if pair % 2 else ("transformers", "lean")):
                        lm.lean = lean if which == "lean" else None
                        seconds = _seconds(lm, tokens)
                        if pair >= 2:
                            timings[which].append(seconds)
                lm.lean = lean
                ratio = statistics.median(b / a for a, b in zip(timings["transformers"], timings["lean"]))
                print(f"| {name} | {context} | {size} | {1000 * statistics.median(timings['transformers']):.1f} | "
                      f"{1000 * statistics.median(timings['lean']):.1f} | {ratio:.3f} | {same} |", flush=True)


if __name__ == "__main__":
    main()
