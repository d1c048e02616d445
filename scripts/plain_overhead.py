"""Do plain steps under the online controller cost what plain decoding costs? Side by side on the same prompts.

Per prompt (the first turn of each dataset's first ``--limit`` prompts), ``--repeats`` rounds in a rotated order of
``ar`` (plain decoding, no controller) and ``kept-plain`` (TALON with ``budget="auto"`` and a controller that runs
the real controller's bookkeeping every step but always answers N = 1: the step records, the target's confidence,
the costs and values it learns). Prints per dataset the median tokens per second of each, their ratio, and the
draft seconds of kept-plain (0: a draft LM that never drafts never forwards the prompt either).

    python scripts/plain_overhead.py --datasets sum,qa,humaneval --limit 2 --max-new-tokens 64 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import time

from talon_sd.bench.datasets import load_prompts
from talon_sd.bench.machine import machine_info
from talon_sd.bench.runner import prompt_ids
from talon_sd.config import TreeConfig
from talon_sd.control import BudgetController, ControllerSettings
from talon_sd.generator import SpeculativeGenerator


class KeptPlain(BudgetController):
    """The real controller, answering N = 1 every step (as it does on a CPU where trees never pay)."""

    def next_budget(self, catch_up_tokens: int = 0, tokens_left: int | None = None) -> int:
        super().next_budget(catch_up_tokens, tokens_left)
        self.reason = "choice"
        return 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--datasets", default="sum,qa,humaneval")
    parser.add_argument("--limit", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    generator = SpeculativeGenerator(dtype=args.dtype)
    generator._controller = lambda tree, sampling, drafter: KeptPlain(ControllerSettings())  # every call kept plain
    print(machine_info(), generator.target.dtype)
    rows = {}
    for index, prompt in enumerate(load_prompts(args.datasets.split(","), limit=args.limit)):
        ids = prompt_ids(generator, prompt, [], 0)
        seconds, draft = {"ar": [], "kept-plain": []}, []
        for round_ in range(args.repeats):
            for variant in (["ar", "kept-plain"] if (index + round_) % 2 == 0 else ["kept-plain", "ar"]):
                tree = TreeConfig("ar") if variant == "ar" else TreeConfig("talon", budget="auto")
                started = time.perf_counter()
                tokens, stats = generator.token_stream(input_ids=ids, max_new_tokens=args.max_new_tokens, tree=tree)
                count = len(list(tokens))
                seconds[variant].append(count / (time.perf_counter() - started))
                if variant == "kept-plain":
                    draft.append(stats.seconds_draft + stats.draft_forwards)
        rate = {variant: statistics.median(values) for variant, values in seconds.items()}
        rows.setdefault(prompt.dataset, []).append((rate["ar"], rate["kept-plain"], ids.numel(), max(draft)))
        print(f"{prompt.dataset} {prompt.question_id}: {ids.numel()} prompt tokens, ar {rate['ar']:.2f} tok/s, "
              f"kept-plain {rate['kept-plain']:.2f} tok/s ({rate['kept-plain'] / rate['ar']:.3f}), "
              f"draft seconds + forwards {max(draft)}", flush=True)
    everything = [row for dataset_rows in rows.values() for row in dataset_rows]
    for dataset, dataset_rows in list(rows.items()) + [("all", everything)]:
        ratio = statistics.median(kept / ar for ar, kept, _, _ in dataset_rows)
        print(f"| {dataset} | {statistics.median(r[2] for r in dataset_rows):.0f} | "
              f"{statistics.median(r[0] for r in dataset_rows):.2f} | {statistics.median(r[1] for r in dataset_rows):.2f} "
              f"| {ratio:.3f} | {max(r[3] for r in dataset_rows)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
