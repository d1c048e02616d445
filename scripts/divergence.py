"""Where and why a greedy benchmark's outputs leave `ar`: the target's float32 logit margin there.

In bfloat16, a multi-token verification computes logits 0.1-0.4 away from the one-token path (see
docs/BENCHMARKS.md), so a speculative method may pick the other token at a near-tie. This script
checks that explanation on a finished `talon bench` run: for every sample whose token ids differ
from `ar`'s, it takes the first differing position k, runs the target in float32 over
prompt + ar[:k] (no cache, one forward), and prints the float32 logit of `ar`'s token minus the
logit of the method's token. A small margin means a near-tie (the two bf16 paths may rank the two
tokens either way); a large one would point at a bug. A run with ``--quantize int4/int8`` is checked on the
target quantized as it ran (float32 activations).

    python scripts/divergence.py docs/bench/greedy [--methods talon,eagle,chain,hf,hf-assisted]

Prompts are rebuilt exactly as the runner built them (chat template, MT-Bench turn 2 after `ar`'s
answer) and checked against the recorded prompt lengths.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics

import torch

from talon_sd.bench.datasets import load_prompts
from talon_sd.bench.runner import prompt_ids, text_of
from talon_sd.generator import SpeculativeGenerator
from talon_sd.models import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", type=pathlib.Path, help="a talon bench --out folder (greedy)")
    parser.add_argument("--methods", default="talon,eagle,chain,static,hf,hf-assisted")
    args = parser.parse_args()
    results = json.loads((args.run / "results.json").read_text())
    settings = results["settings"]
    if settings["mode"] != "greedy":
        raise SystemExit("divergence: the run must be greedy")
    tokens: dict[tuple[int, str], list[int]] = {}
    for line in (args.run / "outputs.jsonl").read_text().splitlines():
        row = json.loads(line)
        tokens[(row["index"], row["label"])] = row["token_ids"]
    prompt_lengths = {s["index"]: s["prompt_tokens"] for s in results["samples"] if s["label"] == "ar"}
    labels = [m for m in args.methods.split(",") if any(label == m for _, label in tokens)]

    torch.set_num_threads(settings["threads"])
    quantize = settings.get("arguments", {}).get("quantize")  # a quantized run: its own quantized target
    loaded = load_model(settings["target"], dtype="float32", quantize=quantize if quantize in ("int4", "int8") else "none")
    generator = SpeculativeGenerator.from_models(loaded.model, loaded.model, loaded.tokenizer, tree="ar")
    prompts = load_prompts(settings["datasets"], settings["limit"], settings["data_files"])

    rows, margins, index = [], {label: [] for label in labels}, 0
    cache: dict[tuple[int, int], torch.Tensor] = {}
    for prompt in prompts:
        history: list[dict] = []
        for turn in range(prompt.num_turns):
            ids = prompt_ids(generator, prompt, history, turn)
            assert ids.numel() == prompt_lengths[index], (index, ids.numel(), prompt_lengths[index])
            ar = tokens[(index, "ar")]
            for label in labels:
                other = tokens[(index, label)]
                k = next((i for i, (a, b) in enumerate(zip(ar, other)) if a != b), None)
                if k is None:
                    continue
                if (index, k) not in cache:
                    context = torch.cat([ids, torch.tensor(ar[:k], dtype=torch.long)])
                    with torch.inference_mode():
                        cache[(index, k)] = loaded.model(input_ids=context[None]).logits[0, -1].float()  # [V]
                logits = cache[(index, k)]
                margin = float(logits[ar[k]] - logits[other[k]])
                argmax_is_ar = int(logits.argmax()) == ar[k]
                margins[label].append(margin)
                rows.append((prompt.dataset, prompt.question_id, turn + 1, label, k, argmax_is_ar, margin))
            history = history + [{"role": "user", "content": prompt.turns[turn]},
                                 {"role": "assistant", "content": text_of(generator, ar)}]
            index += 1

    print("| dataset | question | turn | method | first differing token | fp32 argmax = ar's token | fp32 margin (ar - method) |")
    print("|---|---|---|---|---|---|---|")
    for dataset, question, turn, label, k, argmax_is_ar, margin in rows:
        print(f"| {dataset} | {question} | {turn} | {label} | {k} | {'yes' if argmax_is_ar else 'no'} | {margin:+.3f} |")
    print()
    print("| method | samples differing from ar | median abs fp32 margin | max abs fp32 margin |")
    print("|---|---|---|---|")
    for label in labels:
        values = [abs(m) for m in margins[label]]
        if values:
            print(f"| {label} | {len(values)} | {statistics.median(values):.3f} | {max(values):.3f} |")
        else:
            print(f"| {label} | 0 | - | - |")


if __name__ == "__main__":
    main()
