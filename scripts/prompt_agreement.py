"""Does a prompt say, before the first drafted step, how well the draft will be accepted on its answer?

For every first-turn prompt of a recorded position file (``scripts/record_positions.py``; MT-Bench second turns are
skipped) this runs the target and the draft once over the prompt, chat template included (no cache, full logits),
and prints per prompt: the share of prompt positions where the draft's argmax equals the target's (``agree``; over
the last 64 positions: ``tail``), the draft's mean probability of the target's argmax (``soft``), the target's mean
top-1 probability (``conf``), and from the recorded trees (greedy, noise-free clock of ``--hardware``) the tokens a
step commits at a fixed budget of 16 (``c16``) and that budget's speed over plain decoding (``r16``). Then the
Spearman rank correlation of each prompt measure with ``c16`` and ``r16``, and the per-dataset ranges.

    python scripts/prompt_agreement.py docs/bench/online-sweep13/positions.jsonl.gz [--hardware avx2-fp32]

Acceptance is greedy agreement of the two models on the answer's context; ``agree`` is the same agreement on the
prompt's. The loop measures ``spread`` for the controller since design 29 and ``soft`` over the same rows since design 44
(talon_sd/control/); before design 29 a new request started from what the last requests' text said (designs 7, 8,
25), which is where a short answer after long, well-drafting ones lost (docs/BENCHMARKS.md section 5, "after design 28").
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))

import replay_positions as replay  # noqa: E402

from talon_sd.bench.datasets import load_prompts  # noqa: E402
from talon_sd.bench.runner import prompt_ids  # noqa: E402
from talon_sd.decoding import agreement_positions  # noqa: E402
from talon_sd.generator import SpeculativeGenerator  # noqa: E402

TAIL = 64  # prompt positions of the "tail" measure
MEASURES = ("agree", "tail", "spread", "text", "soft", "conf")


def prompt_measures(generator: SpeculativeGenerator, ids: torch.Tensor) -> dict[str, float]:
    """The four prompt measures of ``ids`` [L] (module docstring)."""
    with torch.no_grad():
        logits_target = generator.target.model(input_ids=ids[None]).logits[0].float()  # [L, V]
        logits_draft = generator.draft.model(input_ids=ids[None]).logits[0].float()  # [L, V']
    vocab = min(logits_target.shape[-1], logits_draft.shape[-1])  # the pair shares a tokenizer; padding differs
    top_target = logits_target[:, :vocab].argmax(-1)  # [L]
    agree = (top_target == logits_draft[:, :vocab].argmax(-1)).float()  # [L]
    p_draft = logits_draft.softmax(-1)
    spread = agreement_positions(ids.numel() - 1)  # what the decoding loop measures (all but the last token)
    return {
        "agree": agree.mean().item(),
        "tail": agree[-TAIL:].mean().item(),
        "spread": agree[spread].mean().item(),
        "text": (logits_draft[:-1, :vocab].argmax(-1) == ids[1:]).float().mean().item(),
        "soft": p_draft.gather(-1, top_target[:, None])[:, 0].mean().item(),
        "conf": logits_target.softmax(-1).max(-1).values.mean().item(),
    }


def spearman(xs: list[float], ys: list[float]) -> float:
    """Rank correlation of ``xs`` and ``ys`` (ties ranked by position)."""
    def ranks(values):
        order = sorted(range(len(values)), key=values.__getitem__)
        result = [0] * len(values)
        for rank, index in enumerate(order):
            result[index] = rank
        return result

    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.mean(rx), statistics.mean(ry)
    covariance = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    return covariance / (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("positions", type=pathlib.Path, nargs="+")
    parser.add_argument("--hardware", choices=sorted(replay.HARDWARE), default="avx2-fp32")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--json", type=pathlib.Path, default=None,
                        help="also write the prompts' measures (index, dataset, prompt_tokens, one key per measure)")
    args = parser.parse_args(argv)
    turns = replay.load_turns(args.positions)
    clock = replay.make_clock(replay.HARDWARE[args.hardware], 0.0, 0)
    generator = SpeculativeGenerator()
    prompts = {dataset: load_prompts([dataset], limit=1 + sum(t.dataset == dataset for t in turns))
               for dataset in dict.fromkeys(t.dataset for t in turns)}
    used = dict.fromkeys(prompts, 0)
    rows = []
    print(f"{'dataset':10} {'turn':>4} {'L':>4} " + " ".join(f"{m:>6}" for m in MEASURES) + f" {'c16':>6} {'r16':>6}")
    for turn in turns:
        listed = prompts[turn.dataset]
        if used[turn.dataset] >= len(listed):
            continue
        ids = prompt_ids(generator, listed[used[turn.dataset]], [], 0)
        if ids.numel() != turn.prompt_tokens:  # an MT-Bench second turn: its prompt holds the first answer
            continue
        used[turn.dataset] += 1
        row = prompt_measures(generator, ids)
        tokens, _, budgets, _ = replay.replay_turn(turn, 16, clock, args.max_new_tokens)
        row.update(index=turn.index, dataset=turn.dataset, prompt_tokens=int(ids.numel()), c16=tokens / len(budgets),
                   r16=replay.speed_over_plain(turn, 16, clock, args.max_new_tokens))
        rows.append(row)
        print(f"{turn.dataset:10} {turn.index:4} {ids.numel():4} " + " ".join(f"{row[m]:6.3f}" for m in MEASURES)
              + f" {row['c16']:6.2f} {row['r16']:6.3f}", flush=True)
    if args.json is not None:
        keys = ("index", "dataset", "prompt_tokens") + MEASURES
        args.json.write_text(json.dumps([{k: round(r[k], 4) if isinstance(r[k], float) else r[k] for k in keys}
                                         for r in rows], indent=1) + "\n")
    print("\nSpearman rank correlation over the prompts:")
    for measure in MEASURES:
        values = [r[measure] for r in rows]
        print(f"  {measure:6} vs c16 {spearman(values, [r['c16'] for r in rows]):6.3f}   "
              f"vs r16 {spearman(values, [r['r16'] for r in rows]):6.3f}")
    print("\nper dataset (min-max):")
    for dataset in prompts:
        chosen = [r for r in rows if r["dataset"] == dataset]
        if chosen:
            ranges = (f"{m} {min(r[m] for r in chosen):.2f}-{max(r[m] for r in chosen):.2f}"
                      for m in MEASURES + ("c16", "r16"))
            print(f"  {dataset:10} " + "  ".join(ranges))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
