"""Seeded sampling, two acceptance rules side by side on the real pair: keyed draws (the rule) against recursive
rejection sampling (the rule before it), in one interleaved run on the same prompts.

Per prompt (the first turn of each dataset's first ``--limit`` prompts), ``--repeats`` rounds in a rotated order of
``ar`` (plain decoding, keyed draws), ``keyed`` (TALON, ``--budget``, keyed draws) and ``rejection`` (the same tree,
recursive rejection over siblings as SpecInfer / EAGLE sample: a child x is accepted with probability
r(x) / sum(r), r the target's residual, which loses x when it is rejected; the bonus is drawn from what is left).
Every variant samples prompt i with seed ``--seed`` + i. Prints per dataset the median tokens per second over
``ar``'s, MAT, and whether ``keyed``'s text equals ``ar``'s (it must, in float32: the same seed is the same text);
writes every run to ``--out`` as JSON lines (resumable: finished runs are skipped).

    python scripts/ab_sampling_rules.py --dtype float32 --limit 3 --max-new-tokens 128 --repeats 2 --out runs/rules.jsonl
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import statistics
import time
from collections import defaultdict

import torch

import talon_sd.decoding as decoding
from talon_sd.bench.datasets import DATASETS, load_prompts
from talon_sd.bench.machine import machine_info
from talon_sd.bench.runner import prompt_ids
from talon_sd.config import TreeConfig
from talon_sd.generator import SpeculativeGenerator
from talon_sd.verify import Acceptance, accept, warp


def accept_by_rejection(tree, logits, sampling, noise, root_position) -> Acceptance:
    """Recursive rejection over siblings (draft tokens as point masses), its randomness from a generator seeded by
    the request's seed and the root's position (so a run is reproducible; the text depends on the tree)."""
    if sampling.greedy:
        return accept(tree, logits, sampling, noise, root_position)
    generator = torch.Generator().manual_seed((noise.seed * 1_000_003 + root_position) % 2 ** 63)
    tokens, children, path = tree.tokens.tolist(), tree.children, [0]
    while True:
        residual = warp(logits[path[-1]], sampling).cpu().double()  # [V] p_target, then what rejections leave
        child = None
        for candidate in children[path[-1]]:
            if float(torch.rand((), generator=generator)) < float(residual[tokens[candidate]] / residual.sum()):
                child = candidate
                break
            residual[tokens[candidate]] = 0.0
        if child is None:
            bonus = int(torch.multinomial(residual / residual.sum(), 1, generator=generator))
            return Acceptance(path, [tokens[i] for i in path[1:]], bonus)
        path.append(child)


def run(generator, ids, variant: str, budget: str | int, args, seed: int) -> dict:
    decoding.accept = accept_by_rejection if variant == "rejection" else accept
    tree = TreeConfig("ar") if variant == "ar" else TreeConfig("talon", budget=budget)
    started = time.perf_counter()
    tokens, stats = generator.token_stream(input_ids=ids, max_new_tokens=args.max_new_tokens, do_sample=True,
                                           temperature=args.temperature, seed=seed, tree=tree)
    token_ids = list(tokens)
    seconds = time.perf_counter() - started
    return {"tokens": token_ids, "seconds": seconds, "mat": stats.mat, "tok_s": len(token_ids) / seconds}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--datasets", default=",".join(DATASETS))
    parser.add_argument("--limit", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--budget", default="auto", help="TALON's budget for both rules (auto: the controller)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=pathlib.Path, required=True)
    args = parser.parse_args()
    budget = args.budget if args.budget == "auto" else int(args.budget)
    done = {}
    if args.out.exists():
        for line in args.out.read_text().splitlines():
            row = json.loads(line)
            if "variant" in row:  # the first line is the run's header
                done[(row["prompt"], row["round"], row["variant"])] = row
    prompts = load_prompts(args.datasets.split(","), limit=args.limit)
    variants = ["ar", "keyed", "rejection"]
    todo = [(index, round_, variant) for index in range(len(prompts)) for round_ in range(args.repeats)
            for variant in variants if (index, round_, variant) not in done]
    if todo:  # load the pair only when something is left to run
        generator = SpeculativeGenerator(dtype=args.dtype)
        if not args.out.exists():
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps({"machine": machine_info(), "dtype": str(generator.target.dtype),
                                            "args": vars(args) | {"out": str(args.out)}}) + "\n")
        generator.generate(input_ids=prompt_ids(generator, prompts[0], [], 0), max_new_tokens=8)  # warm-up
    for index, prompt in enumerate(prompts):
        if not any(key[0] == index for key in todo):
            continue
        ids = prompt_ids(generator, prompt, [], 0)
        for round_ in range(args.repeats):
            shift = (index + round_) % len(variants)
            for variant in variants[shift:] + variants[:shift]:
                if (index, round_, variant) in done:
                    continue
                row = {"prompt": index, "dataset": prompt.dataset, "round": round_, "variant": variant,
                       **run(generator, ids, variant, budget, args, args.seed + index)}
                done[(index, round_, variant)] = row
                with args.out.open("a") as out:
                    out.write(json.dumps(row) + "\n")
    table = defaultdict(lambda: defaultdict(list))
    equal = defaultdict(list)
    for index, prompt in enumerate(prompts):
        medians = {v: statistics.median(done[(index, r, v)]["tok_s"] for r in range(args.repeats)) for v in variants}
        for variant in variants:
            table[prompt.dataset][variant].append(medians[variant] / medians["ar"])
            table[prompt.dataset][variant + " MAT"].append(statistics.mean(done[(index, r, variant)]["mat"]
                                                                            for r in range(args.repeats)))
            table[prompt.dataset][variant + " tok/s"].append(medians[variant])
        equal[prompt.dataset].append(all(done[(index, r, "keyed")]["tokens"] == done[(index, r, "ar")]["tokens"]
                                         for r in range(args.repeats)))
    print("| dataset | ar tok/s | keyed / ar | rejection / ar | keyed MAT | rejection MAT | keyed text = ar's |")
    print("|---|---|---|---|---|---|---|")
    for dataset, columns in list(table.items()) + [("all", {k: [x for c in table.values() for x in c[k]]
                                                            for k in next(iter(table.values()))})]:
        flags = equal[dataset] if dataset != "all" else [x for e in equal.values() for x in e]
        print(f"| {dataset} | {statistics.median(columns['ar tok/s']):.2f} | {statistics.median(columns['keyed']):.3f} | "
              f"{statistics.median(columns['rejection']):.3f} | {statistics.mean(columns['keyed MAT']):.2f} | "
              f"{statistics.mean(columns['rejection MAT']):.2f} | {sum(flags)}/{len(flags)} |")
    logs = [math.log(statistics.mean(done[(i, r, "keyed")]["mat"] for r in range(args.repeats))
                     / statistics.mean(done[(i, r, "rejection")]["mat"] for r in range(args.repeats)))
            for i in range(len(prompts))]  # the rules sample different texts: compare per prompt, with the spread
    print(f"MAT keyed / rejection per prompt: keyed higher on {sum(x > 0 for x in logs)} of {len(logs)}, geometric "
          f"mean {math.exp(statistics.mean(logs)):.3f} (standard error x{math.exp(statistics.stdev(logs) / len(logs) ** 0.5):.3f})")
    for round_ in range(args.repeats):  # all prompts' tokens over their seconds and target forwards, per round
        rows = [done[(i, round_, v)] for i in range(len(prompts)) for v in variants]
        total = {v: (sum(len(r["tokens"]) for r in rows if r["variant"] == v),
                     sum(r["seconds"] for r in rows if r["variant"] == v),
                     sum(len(r["tokens"]) / r["mat"] for r in rows if r["variant"] == v)) for v in variants}
        print(f"round {round_ + 1}: " + ", ".join(f"{v} {t / s:.2f} tok/s" + (f" MAT {t / f:.2f}" if v != "ar" else "")
                                                 for v, (t, s, f) in total.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
