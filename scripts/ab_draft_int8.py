"""A/B of the draft LM's linears: float32 (as ``--cpu-kernels`` loads it) against int8 (dynamic quantization).

Loads the default pair once, then a second copy of the draft with int8 linears
(:func:`talon_sd.lm.quantize_linears_int8`), and runs ``ar``, talon ``auto`` with the float32 draft and talon
``auto`` with the int8 draft on the first ``--limit`` prompts (first turns) of each dataset, order rotated per
prompt; each auto variant carries its own controller memory from prompt to prompt. Prints per prompt tok/s, MAT,
delta and the draft/verify seconds, then each variant's ratio to ``ar`` per dataset and overall (median of
per-prompt ratios and ratio of summed rates). Machine noted first.

    python scripts/ab_draft_int8.py --dtype float32 --datasets sum,humaneval --limit 2
"""

from __future__ import annotations

import argparse
import statistics
import time

from talon_sd import models
from talon_sd.bench.datasets import load_prompts
from talon_sd.bench.machine import machine_info
from talon_sd.bench.runner import prompt_ids
from talon_sd.config import TreeConfig
from talon_sd.generator import SpeculativeGenerator
from talon_sd.lm import kernels_of, quantize_linears_int8


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--datasets", default="sum,humaneval")
    parser.add_argument("--limit", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0)
    args = parser.parse_args()
    info = machine_info()
    print(f"machine: {info['cpu']}, bf16 native: {info['bf16_native']}, load {info['load_average']}", flush=True)
    fp32 = SpeculativeGenerator(None, None, tree="talon", dtype=args.dtype, quantize="none")
    loaded = models.load_model(models.DEFAULT_DRAFT, role="draft", dtype=args.dtype)
    quantize_linears_int8(loaded.model)
    int8 = SpeculativeGenerator.from_models(fp32.target_model, loaded.model, fp32.tokenizer, tree="talon")
    print(f"drafts: {kernels_of(fp32.draft_model)} / {kernels_of(int8.draft_model)}; target {kernels_of(fp32.target_model)}")
    variants = {"ar": fp32, "fp32-draft": fp32, "int8-draft": int8}
    memories: dict[str, dict] = {"fp32-draft": {}, "int8-draft": {}}
    ratios: dict[tuple[str, str], list[float]] = {}
    index = 0
    for dataset in args.datasets.split(","):
        for prompt in load_prompts([dataset], args.limit):
            ids = prompt_ids(fp32, prompt, [], 0)
            names = list(variants)
            order = names[index % 3:] + names[:index % 3]
            index += 1
            rates, outputs = {}, {}
            for name in order:
                generator = variants[name]
                tree = TreeConfig("ar") if name == "ar" else TreeConfig("talon", budget="auto")
                if name != "ar":
                    generator.restore_controller_memory(memories[name])
                started = time.perf_counter()
                tokens, stats = generator.token_stream(input_ids=ids, max_new_tokens=args.max_new_tokens,
                                                       do_sample=args.temperature > 0, temperature=args.temperature
                                                       or 1.0, seed=index, tree=tree)
                outputs[name] = list(tokens)
                seconds = time.perf_counter() - started
                if name != "ar":
                    memories[name] = generator.controller_memory()
                rates[name] = len(outputs[name]) / seconds
                print(f"{dataset} {index} {name}: {rates[name]:.2f} tok/s, {len(outputs[name])} tokens, MAT {stats.mat:.2f}, "
                      f"delta {stats.delta:.2f}, draft {stats.seconds_draft:.1f} s, verify {stats.seconds_verify:.1f} s",
                      flush=True)
            for name in ("fp32-draft", "int8-draft"):
                ratios.setdefault((dataset, name), []).append(rates[name] / rates["ar"])
                ratios.setdefault(("all", name), []).append(rates[name] / rates["ar"])
            if args.temperature == 0:
                print(f"identical to ar: {[outputs[n] == outputs['ar'] for n in ('fp32-draft', 'int8-draft')]}")
    for (dataset, name), values in ratios.items():
        print(f"{dataset} {name}: median {statistics.median(values):.3f}x of ar over {len(values)} prompts "
              f"({', '.join(f'{v:.2f}' for v in values)})")


if __name__ == "__main__":
    main()
