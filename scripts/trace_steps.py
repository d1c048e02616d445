"""Trace the online controller step by step on real prompts, in one process: what it chose, why, and what it cost.

Runs requests one after the other on one :class:`talon_sd.SpeculativeGenerator` (so an ``auto`` request starts from
what the ones before it learned, as in ``talon bench``), each given as ``METHOD:DATASET:INDEX``: METHOD ``auto``
(talon, budget auto), ``ar`` or a fixed talon budget (``16``); DATASET:INDEX a packaged prompt (first turn). For
every request prints its seconds, tokens and prefill; for auto ones each step's budget, reason, accepted tokens, draft
forwards, seconds (draft, catch-up apart, verify) and the controller's plain and choice rates before it, then the
rate of its drafted and of its plain steps (committed tokens per second of the steps' own time), with the seconds the
cost model gave those very steps and the tokens their budget's samples expected (where an optimistic rate comes from).

    python scripts/trace_steps.py auto:humaneval:0 auto:sum:0 ar:sum:0 [--temperature 1]

(the second request is CNN/DM's first prompt after HumanEval's: where a carried drafted choice meets a 709-token
prompt; docs/BENCHMARKS.md section 5).
"""

from __future__ import annotations

import argparse
import time

from talon_sd import SpeculativeGenerator
from talon_sd.bench.datasets import load_prompts
from talon_sd.bench.runner import prompt_ids
from talon_sd.control import BudgetController, StepRecord, prefix_outcome


def watch(steps: list[dict], predicted: set[int] = frozenset()) -> None:
    """Record every observed step of every BudgetController into ``steps`` (the class's observe, wrapped), with the
    rates the recent text predicts (design 12) for the budgets in ``predicted``."""
    observe = BudgetController.observe

    def observed(self: BudgetController, record: StepRecord) -> None:
        before, choice = self.rates(), self.choice  # what the step was planned on
        forecast = {k: self._predicted_rate(k) for k in sorted(predicted) if k in self._index_of}
        # the cost model's seconds for this very step (its own tree, before it is learned from), and the committed
        # tokens the samples that inform its budget said it would get (their weighted mean; None for a plain step)
        modelled = self.estimated_seconds(prefix_outcome(record, record.budget)) if self.verify_cost.samples else None
        expected = None
        index = self._index_of.get(record.budget)
        if record.forward_widths and index is not None:
            weight = tokens = 0.0
            for sample in self._samples[index]:
                if sample.stamp != self._version:
                    self._prepare(sample)
                weight, tokens = weight + sample.weight, tokens + sample.weight * sample.outcomes[index][0]
            expected = tokens / weight if weight > 0 else None
        observe(self, record)
        steps.append(dict(budget=record.budget, reason=self.reason, accepted=len(record.accepted),
                          forwards=len(record.forward_widths), draft=sum(record.draft_seconds),
                          catch_up=record.catch_up_seconds or 0.0, verify=record.verify_seconds,
                          other=record.other_seconds, plain_rate=before.get(1), choice=choice,
                          choice_rate=before.get(choice), rates=before, predicted=forecast, modelled=modelled,
                          expected=expected))

    BudgetController.observe = observed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("requests", nargs="+", help="METHOD:DATASET:INDEX, e.g. auto:sum:0")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default); else sampled, seeded")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rates", type=lambda text: {int(k) for k in text.split(",")}, default=set(),
                        help="also print the controller's rates of these budgets before every step, and the rates the "
                             "recent text predicts for them (design 12), e.g. 4,8,16")
    args = parser.parse_args()
    specs = [spec.split(":") for spec in args.requests]
    if any(len(spec) != 3 or not spec[2].isdigit() for spec in specs):
        parser.error("requests: each one METHOD:DATASET:INDEX, e.g. auto:sum:0")
    steps: list[dict] = []
    watch(steps, args.rates)
    generator = SpeculativeGenerator()
    print(f"kernels {generator.cpu_kernels}")
    for method, dataset, index in specs:
        prompts = load_prompts([dataset], limit=int(index) + 1)
        ids = prompt_ids(generator, prompts[int(index)], [], 0)
        tree = None if method == "auto" else "ar" if method == "ar" else generator.tree_config.with_options(
            budget=int(method))
        steps.clear()
        started = time.perf_counter()
        sampling = {"do_sample": True, "temperature": args.temperature, "seed": args.seed} if args.temperature else {}
        result = generator.generate(input_ids=ids.tolist(), max_new_tokens=args.max_new_tokens, **sampling,
                                    **({} if tree is None else {"tree": tree}))
        seconds = time.perf_counter() - started
        stats = result.stats
        print(f"{method}:{dataset}:{index}  prompt {ids.numel()} tokens, {stats.new_tokens} new in {seconds:.1f} s "
              f"({stats.new_tokens / seconds:.3f} tok/s), prefill {stats.seconds_prefill:.2f} s, "
              f"{stats.target_forwards} steps, {stats.seconds_verify / stats.target_forwards:.3f} s verify a step; "
              f"draft {stats.seconds_draft:.2f} s, build {stats.seconds_build:.2f} s, verify {stats.seconds_verify:.2f} s, "
              f"{stats.draft_forwards} draft forwards")
        for step in steps:
            rates = (f"plain {step['plain_rate']:.2f}" if step["plain_rate"] else "plain -") + (
                f", choice {step['choice']} {step['choice_rate']:.2f}" if step["choice_rate"] else "")
            print(f"  N={step['budget']:<3} {step['reason']:<20} accepted {step['accepted']:<3} forwards "
                  f"{step['forwards']:<3} draft {step['draft']:.2f} catch-up {step['catch_up']:.2f} verify "
                  f"{step['verify']:.2f}  ({rates} tok/s)")
            if args.rates:
                print("      rates " + " ".join(f"{k}:{v:.2f}" for k, v in sorted(step["rates"].items())
                                            if k in args.rates)
                      + "   predicted " + " ".join(f"{k}:{v:.2f}" for k, v in step["predicted"].items() if v is not None))
        for name, chosen in (("drafted", [s for s in steps if s["forwards"]]),
                             ("plain", [s for s in steps if not s["forwards"]])):
            busy = sum(s["draft"] + s["verify"] + s["other"] for s in chosen)
            if chosen and busy > 0:
                print(f"  {name} steps: {len(chosen)}, {sum(s['accepted'] + 1 for s in chosen) / busy:.3f} tok/s "
                      f"(catch-ups apart: {sum(s['catch_up'] for s in chosen):.2f} s)")
                modelled = [s for s in chosen if s["modelled"]]
                if modelled:  # how the controller's model of these steps compared with what they did
                    print(f"    seconds: {sum(s['draft'] + s['verify'] + s['other'] for s in modelled):.2f} measured, "
                          f"{sum(s['modelled'] for s in modelled):.2f} modelled (cost curves at the step)")
                expected = [s for s in chosen if s["expected"] is not None]
                if expected:
                    print(f"    tokens: {sum(s['accepted'] + 1 for s in expected)} committed, "
                          f"{sum(s['expected'] for s in expected):.1f} expected (the informing samples' mean)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
