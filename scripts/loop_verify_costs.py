"""What a tree verify costs inside the decoding loop, by tree size, against the same forward on its own.

``scripts/forward_costs.py`` times one target forward over a tree in isolation; the controller and the replays price
steps with such curves. This script times every target verify forward of real generations (TALON at a fixed
``--budget`` or at ``auto``, the first ``--limit`` prompts of ``--datasets``, after an untimed 8-token warm-up) and
prints each request's (tree size, seconds) and the median seconds per tree size; with ``--interleave`` it instead
times, in one process over a ``--context``-token cache, a 1-node and a 16-node verify alone, right after four int8
draft forwards of width 4, and after 0.3 s idle (whether a drafted step's verify costs more in the loop).

    python scripts/loop_verify_costs.py --budget 16 --datasets qa,alpaca --limit 3 --max-new-tokens 24 --rounds 2
    python scripts/loop_verify_costs.py --budget auto --datasets humaneval,sum,qa,alpaca --limit 2 --max-new-tokens 48
    python scripts/loop_verify_costs.py --interleave --rounds 5
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time

from talon_sd import SpeculativeGenerator
from talon_sd.bench.datasets import load_prompts
from talon_sd.bench.machine import machine_info
from talon_sd.bench.measure import _context_ids, _one_forward
from talon_sd.bench.runner import prompt_ids
from talon_sd.config import TreeConfig
from talon_sd.lm import CausalLM


def in_loop(generator: SpeculativeGenerator, args) -> None:
    """Time every verify forward of the generations (CausalLM.forward_tree wrapped for this process only)."""
    original, log = CausalLM.forward_tree, []

    def timed(self, tree, *rest, **options):
        started = time.perf_counter()
        out = original(self, tree, *rest, **options)
        log.append((tree.size, time.perf_counter() - started))
        return out

    prompts = load_prompts(args.datasets.split(","), limit=args.limit)
    generator.generate(input_ids=prompt_ids(generator, prompts[0], [], 0).tolist(), max_new_tokens=8)  # warm-up, untimed
    CausalLM.forward_tree = timed
    by_size = collections.defaultdict(list)
    try:
        for round_ in range(args.rounds):
            for prompt in prompts:
                log.clear()
                generator.generate(input_ids=prompt_ids(generator, prompt, [], 0).tolist(),
                                   max_new_tokens=args.max_new_tokens)
                for size, seconds in log:
                    by_size[size].append(seconds)
                print(round_, prompt.dataset, prompt.question_id, [(size, round(s, 3)) for size, s in log], flush=True)
    finally:
        CausalLM.forward_tree = original
    for size in sorted(by_size):
        values = by_size[size]
        print(f"size {size:3}: {len(values):4} forwards, median {statistics.median(values):.3f} s "
              f"({min(values):.3f}-{max(values):.3f})")


def interleaved(generator: SpeculativeGenerator, args) -> None:
    """A 1- and a 16-node verify alone, after four draft forwards of width 4, and after 0.3 s idle."""
    target, draft = generator.target, CausalLM(generator.draft_model, role="draft")
    target.prefill(_context_ids(target, args.context, 32))
    draft.prefill(_context_ids(draft, args.context, 32))
    past, draft_past = target.cache.length, draft.cache.length
    seconds = collections.defaultdict(list)
    for round_ in range(args.rounds + 1):  # round 0 is an untimed warm-up
        for mode in ("alone", "after draft forwards", "after 0.3 s idle"):
            for size in (1, 16):
                if mode == "after draft forwards":
                    for _ in range(4):
                        _one_forward(draft, 4, "draft", draft_past)
                        draft.cache.crop(draft_past)
                elif mode == "after 0.3 s idle":
                    time.sleep(0.3)
                started = time.perf_counter()
                _one_forward(target, size, "verify", past)
                elapsed = time.perf_counter() - started
                target.cache.crop(past)
                if round_:
                    seconds[(mode, size)].append(elapsed)
    for (mode, size), values in sorted(seconds.items()):
        print(f"{mode:22} {size:3} nodes: median {statistics.median(values):.3f} s  {[round(v, 2) for v in values]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", default="16", help="TALON's budget: a number or auto")
    parser.add_argument("--datasets", default="qa,alpaca")
    parser.add_argument("--limit", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--interleave", action="store_true")
    parser.add_argument("--context", type=int, default=150, help="cache tokens for --interleave")
    args = parser.parse_args()
    budget = args.budget if args.budget == "auto" else int(args.budget)
    generator = SpeculativeGenerator(tree=TreeConfig(method="talon", budget=budget, topk=4, mu=0.03), dtype=args.dtype)
    print("machine:", machine_info().get("cpu"), "| draft kernels:", generator.cpu_kernels.get("draft"), flush=True)
    (interleaved if args.interleave else in_loop)(generator, args)


if __name__ == "__main__":
    main()
