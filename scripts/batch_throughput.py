"""Total tokens per second of R requests decoded together (``generate_batch``) against the same R one after another.

Prints one row per method and batch size: the R requests' committed tokens over the wall time, one after another
(``generate``) and together (``generate_batch``), their ratio, and MAT. Requests are the first R prompts of the
datasets named (chat-templated), greedy, ``--max-new-tokens`` each, both ways on the same prompts in one process.

    python scripts/batch_throughput.py --batch 1,4,8 --methods ar,talon:4 --max-new-tokens 48
"""

from __future__ import annotations

import argparse
import statistics
import time

from talon_sd import SpeculativeGenerator, TreeConfig
from talon_sd.bench.datasets import load_prompts
from talon_sd.bench.machine import machine_info


def tree_of(method: str) -> TreeConfig:
    name, _, budget = method.partition(":")
    if name == "ar":
        return TreeConfig("ar")
    return TreeConfig(name, budget="auto" if budget in ("", "auto") else int(budget), topk=4)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", default="1,4,8", help="comma-separated batch sizes")
    parser.add_argument("--methods", default="ar,talon:4", help="ar, or talon:N / talon:auto, comma-separated")
    parser.add_argument("--datasets", default="mt_bench,gsm8k,humaneval,alpaca")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    args = parser.parse_args(argv)
    sizes = [int(b) for b in args.batch.split(",")]
    prompts = [[{"role": "user", "content": p.turns[0]}]
               for p in load_prompts(args.datasets.split(","), limit=max(sizes))][: max(sizes)]
    generator = SpeculativeGenerator()
    info = machine_info()
    print(f"{info['cpu']} ({info['isa']}), {info['torch_threads']} threads, dtype {generator.target.dtype}, "
          f"load {info['load_average']}")
    print(f"greedy, {args.max_new_tokens} new tokens per request, datasets {args.datasets}")
    print("| method | requests | one after another tok/s | together tok/s | ratio | MAT together |")
    print("|---|---|---|---|---|---|")
    generator.generate(prompts[0], max_new_tokens=8)  # warm-up
    for method in args.methods.split(","):
        tree = tree_of(method)
        for size in sizes:
            batch = prompts[:size]
            started = time.perf_counter()
            alone = [generator.generate(p, max_new_tokens=args.max_new_tokens, tree=tree) for p in batch]
            alone_seconds = time.perf_counter() - started
            started = time.perf_counter()
            together = generator.generate_batch(batch, max_new_tokens=args.max_new_tokens, tree=tree)
            together_seconds = time.perf_counter() - started
            tokens_alone = sum(len(r.token_ids) for r in alone)
            tokens_together = sum(len(r.token_ids) for r in together)
            same = sum(a.token_ids == b.token_ids for a, b in zip(alone, together))
            mat = statistics.mean(r.stats.mat for r in together)
            print(f"| {method} | {size} | {tokens_alone / alone_seconds:.2f} | {tokens_together / together_seconds:.2f} | "
                  f"{(tokens_together / together_seconds) / (tokens_alone / alone_seconds):.2f}x | {mat:.2f} |"
                  + ("" if same == size else f" ({size - same} of {size} texts differ: near-ties)"), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
