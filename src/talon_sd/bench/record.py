"""Record the real pair's draft trees at every position of recorded greedy answers: exact replay worlds.

For each prompt turn of a ``talon bench`` / ``talon sweep`` checkpoint, takes the plain (``ar``) answer (or
``--label``'s) as the target's greedy text and, at every position t of it, builds the TALON tree of ``--budget`` nodes that the draft
LM builds from the prompt plus the answer's first t tokens (root = the last of them), exactly as the decoding
loop would (same drafter, builder and cache path; the target is not run per position). Because a smaller
budget's tree is the first k nodes of this one in inclusion order (:mod:`talon_sd.control`, the prefix
property), and greedy acceptance of a tree is the longest path that spells the target's text, one recorded
tree per position answers, for any budget <= ``--budget`` and any start position, what a step would build,
accept and draft: :func:`talon_sd.bench.simulate.replay_step` runs a controller on the real text. The target's
top-1 probability before each answer token (what the controller reads the text's predictability from) comes from
one teacher-forced target forward.

    python scripts/record_positions.py docs/bench/sweep-int8-greedy/checkpoint.jsonl --out positions.jsonl
    python scripts/record_positions.py RUN/checkpoint.jsonl --drafter ngram --out ngram.jsonl   # prompt lookup's trees

One JSON line per prompt turn; resumable (turns already in ``--out`` are skipped). Cost: one draft forward
per tree layer per position (~0.1 s each in bf16 on a 2-core Xeon).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import torch

from ..builders import StepPlan, make_builder
from ..config import TreeConfig
from ..decoding import Forwards, step_record
from ..drafters.model import ModelDrafter
from ..drafters.ngram import NgramDrafter
from ..generator import SpeculativeGenerator
from ..lm import CausalLM
from ..verify import Acceptance
from .datasets import load_prompts
from .runner import prompt_ids, text_of


def checkpoint_turns(path: pathlib.Path, label: str = "ar") -> tuple[dict, list[dict], dict]:
    """(fingerprint, the ``ar`` rows in order, ``label``'s answers by index) of a bench checkpoint."""
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    answers = {row["index"]: row["token_ids"] for row in lines[1:] if row["label"] == label}
    if not answers:
        labels = sorted({row["label"] for row in lines[1:]})
        raise SystemExit(f"--label: no rows labelled {label!r} in {path} (it has {labels})")
    return lines[0]["fingerprint"], [row for row in lines[1:] if row["label"] == "ar"], answers


def target_confidences(generator: SpeculativeGenerator, ids: torch.Tensor, answer: list[int]) -> list[float]:
    """The target's top-1 probability before each answer token (teacher-forced, one forward)."""
    full = torch.cat([ids, torch.tensor(answer, dtype=torch.long)])[None]  # [1, L + A]
    with torch.inference_mode():
        logits = generator.target_model(input_ids=full.to(generator.target.device)).logits[0]  # [L + A, V]
    rows = logits[len(ids) - 1: len(ids) - 1 + len(answer)].float()  # [A, V]
    return torch.softmax(rows, dim=-1).amax(dim=-1).tolist()


def record_turn(generator: SpeculativeGenerator, config: TreeConfig, ids: torch.Tensor, answer: list[int],
                drafter_name: str = "model") -> list[dict]:
    """The tree of ``config.budget`` nodes at every position of ``answer`` (inclusion order, root first), drafted by
    the draft LM (``model``) or by prompt lookup (``ngram``)."""
    builder = make_builder(config)
    drafter = NgramDrafter(generator.target.vocab_size) if drafter_name == "ngram" else \
        ModelDrafter(CausalLM(generator.draft_model, role="draft"), target_vocab_size=generator.target.vocab_size)
    drafter.start(ids)
    positions = []
    root = int(ids[-1])
    for token in answer:
        forwards = Forwards()

        def expand(tree, nodes):
            started = time.perf_counter()
            log_p_draft = drafter.expand(tree, nodes)  # [F, V]
            forwards.seconds_each.append(time.perf_counter() - started)
            forwards.widths.append(int(nodes.numel()))
            forwards.sizes_before.append(tree.size)
            return log_p_draft

        drafter.begin_step(root)
        tree = builder.build(root, expand, generator.target.device, StepPlan(budget=config.budget))
        acceptance = Acceptance(path=[0], tokens=[], bonus_token=int(token))  # commit one token
        record = step_record(builder, tree, acceptance, forwards, None, 0.0, 0.0)  # the loop's own view of the tree
        tokens = tree.tokens.tolist()
        positions.append({
            "tokens": [tokens[node] for node in builder.inclusion_order(tree)],
            "parents": list(record.node_parent),
            "log_p": [round(float(tree.scores[node]), 5) for node in builder.inclusion_order(tree)],
            "widths": list(record.forward_widths),
            "prefix": list(record.prefix_after_forward),
            "draft_seconds": [round(s, 5) for s in record.draft_seconds],
        })
        drafter.accept(tree, acceptance)
        root = int(token)
    return positions


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint", type=pathlib.Path)
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--budget", type=int, default=32, help="nodes per recorded tree (root counted)")
    parser.add_argument("--drafter", choices=("model", "ngram"), default="model",
                        help="whose trees: the draft LM's (default) or the n-gram drafter's (prompt lookup)")
    parser.add_argument("--datasets", default=None, help="comma-separated subset of the checkpoint's datasets")
    parser.add_argument("--label", default="ar",
                        help="whose answers to record (default ar; in bf16 a tree variant's greedy text can differ "
                             "from ar's, e.g. 'talon(N=16,K=4,mu=0.03)'); later turns' prompts still hold ar's answers, "
                             "as the bench sent them")
    args = parser.parse_args(argv)
    fingerprint, rows, answers = checkpoint_turns(args.checkpoint, args.label)
    talon = next(v["tree"] for v in fingerprint["variants"] if v["method"] == "talon")
    config = TreeConfig(method="talon", budget=args.budget, topk=talon["topk"], mu=talon["mu"])
    done = set()
    if args.out.exists():
        done = {json.loads(line)["index"] for line in args.out.read_text().splitlines() if line.strip()}
    generator = SpeculativeGenerator(tree=config, drafter=args.drafter, dtype=fingerprint["dtype"] or "auto")
    datasets = sorted({row["dataset"] for row in rows}, key=[row["dataset"] for row in rows].index)
    prompts = load_prompts(datasets, limit=max(sum(1 for r in rows if r["dataset"] == d and r["turn"] == 1)
                                               for d in datasets))
    wanted = set(args.datasets.split(",")) if args.datasets else set(datasets)
    by_key = {(row["dataset"], row["question_id"], row["turn"]): row for row in rows}
    for prompt in prompts:
        history: list[dict] = []
        for turn in range(prompt.num_turns):
            row = by_key[(prompt.dataset, prompt.question_id, turn + 1)]
            ids = prompt_ids(generator, prompt, history, turn)
            if int(ids.numel()) != row["prompt_tokens"]:
                raise SystemExit(f"{prompt.dataset} {prompt.question_id} turn {turn + 1}: prompt has {ids.numel()} "
                                 f"tokens, the checkpoint {row['prompt_tokens']}")
            answer = answers[row["index"]]
            history = history + [{"role": "user", "content": prompt.turns[turn]},
                                 {"role": "assistant", "content": text_of(generator, row["token_ids"])}]
            if row["index"] in done or prompt.dataset not in wanted:
                continue
            started = time.perf_counter()
            line = {"index": row["index"], "dataset": prompt.dataset, "question_id": prompt.question_id,
                    "turn": turn + 1, "prompt_tokens": int(ids.numel()), "answer": answer,
                    "budget": args.budget, "dtype": fingerprint["dtype"], "drafter": args.drafter,
                    "confidence": [round(c, 5) for c in target_confidences(generator, ids, answer)],
                    "positions": record_turn(generator, config, ids, answer, args.drafter)}
            with args.out.open("a") as out:
                out.write(json.dumps(line) + "\n")
            print(f"{prompt.dataset} {prompt.question_id} t{turn + 1}: {len(answer)} positions, "
                  f"{time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
