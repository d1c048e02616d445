"""A/B of two online-controller settings on the real pair, side by side on the same prompts.

Runs ``ar``, ``auto`` with the default :class:`talon_sd.control.ControllerSettings` and ``auto`` with the
fields given by ``--set`` on the first ``--limit`` prompts (first turns) of one packaged dataset, order
rotated per prompt; each auto variant carries its own controller memory from prompt to prompt, as one
generator serving requests would. Prints tok/s per prompt and the ratios to ``ar``. Example:

    python scripts/ab_controller_settings.py --dtype float32 --dataset humaneval --limit 3 --set exploration=0.05
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter

import talon_sd.control as control
from talon_sd.bench.datasets import load_prompts
from talon_sd.bench.runner import prompt_ids
from talon_sd.config import TreeConfig
from talon_sd.generator import SpeculativeGenerator


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--dataset", default="humaneval")
    parser.add_argument("--limit", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="a ControllerSettings field of the B variant (repeatable)")
    args = parser.parse_args()
    overrides = {name: json.loads(value) for name, value in (item.split("=", 1) for item in args.set)}
    default_settings = control.ControllerSettings
    variant = {"name": "A"}

    class Settings(default_settings):  # the generator builds its controllers' settings through this name
        def __init__(self, **fields):
            default_settings.__init__(self, **{**(overrides if variant["name"] == "B" else {}), **fields})

    control.ControllerSettings = Settings
    generator = SpeculativeGenerator(None, None, tree="talon", dtype=args.dtype)
    memories: dict[str, dict] = {"A": {}, "B": {}}
    totals = {name: [0, 0.0] for name in ("ar", "A", "B")}
    for index, prompt in enumerate(load_prompts([args.dataset], args.limit)):
        ids = prompt_ids(generator, prompt, [], 0)
        order = ["ar", "A", "B"][index % 3:] + ["ar", "A", "B"][:index % 3]
        outputs = {}
        for name in order:
            tree = TreeConfig("ar") if name == "ar" else TreeConfig("talon", budget="auto")
            if name != "ar":
                variant["name"] = name
                generator.restore_controller_memory(memories[name])
            started = time.perf_counter()
            tokens, stats = generator.token_stream(input_ids=ids, max_new_tokens=args.max_new_tokens,
                                                   do_sample=False, tree=tree)
            outputs[name] = list(tokens)
            seconds = time.perf_counter() - started
            if name != "ar":
                memories[name] = generator.controller_memory()
            totals[name][0] += len(outputs[name])
            totals[name][1] += seconds
            budgets = dict(sorted(Counter(stats.budgets).items())) if name != "ar" else ""
            print(f"{index} {name}: {len(outputs[name]) / seconds:.2f} tok/s {budgets}", flush=True)
        print(f"{index} identical to ar: A {outputs['A'] == outputs['ar']}, B {outputs['B'] == outputs['ar']}")
    rate = {name: tokens / seconds for name, (tokens, seconds) in totals.items()}
    print(f"ar {rate['ar']:.2f} tok/s; A (defaults) {rate['A'] / rate['ar']:.3f}x, B ({overrides}) "
          f"{rate['B'] / rate['ar']:.3f}x")


if __name__ == "__main__":
    main()
