"""Whole-model forward costs on this CPU: the target over T tree tokens, and the draft, per dtype and kernels.

For each (dtype, cpu_kernels) variant, loads the default pair (:class:`talon_sd.SpeculativeGenerator`) and times one
target forward over a tree of T nodes (logits for every node, as in verification) and one draft forward
of width w (a tree expansion) on a 200-token cache, median of ``--repeats``
(:func:`talon_sd.bench.measure.measure_forward_costs`). Prints milliseconds, the ratio to T = 1, and the
draft/target cost ratio c at T = w = 1. Machine noted in the first line.

    python scripts/forward_costs.py [--variants float32:default,float32:auto,bfloat16:auto] [--sizes 1,2,4,8,16]
    python scripts/forward_costs.py --variants float32:auto,float32:auto:int8   # the draft's linears in int8 too
    python scripts/forward_costs.py --device cuda --target DIR --draft DIR --variants bfloat16:default

(``cpu_kernels`` is a CPU setting: on a GPU every variant runs the same kernels.)
"""

from __future__ import annotations

import argparse
import gc

import torch

from talon_sd import SpeculativeGenerator
from talon_sd.bench.machine import machine_info
from talon_sd.bench.measure import measure_forward_costs
from talon_sd.lm import CausalLM


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default="float32:default,float32:auto,bfloat16:auto",
                        help="comma-separated dtype:cpu_kernels[:quantize] (the last: none by default; int8/int4 quantize "
                             "target and draft LM)")
    parser.add_argument("--sizes", default="1,2,4,8,16,32")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--context", type=int, default=200)
    parser.add_argument("--target", default=None, help="target model (default: the built-in pair's)")
    parser.add_argument("--draft", default=None, help="draft model (default: the built-in pair's)")
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: cuda if present)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    info = machine_info()
    print(f"machine: {info['cpu']}, bf16 native: {info['bf16_native']}, GPU: {info['cuda'] or 'none'}, "
          f"torch {torch.__version__}, {info['torch_threads']} threads, load average {info['load_average']}")
    header = "| variant | model | " + " | ".join(f"T={s}" for s in sizes) + " | T=2 / T=1 |"
    print(header)
    print("|" + "---|" * (len(sizes) + 3))
    for variant in args.variants.split(","):
        dtype, kernels, *quantization = variant.split(":")
        generator = SpeculativeGenerator(args.target, args.draft, dtype=dtype, device=args.device,
                                         cpu_kernels=kernels, quantize=(quantization or ["none"])[0])
        label = variant.split(":", 1)[1]  # cpu_kernels, and the quantization when given
        draft = CausalLM(generator.draft_model, role="draft")
        rows = {"target": measure_forward_costs(generator.target, sizes, "verify", args.context, args.repeats),
                "draft": measure_forward_costs(draft, sizes, "draft", args.context, args.repeats)}
        for model, costs in rows.items():
            cells = " | ".join(f"{1000 * costs[s]:.0f}" for s in sizes)
            ratio = costs[2] / costs[1] if 1 in costs and 2 in costs else float("nan")
            print(f"| {dtype}, {label} | {model} | {cells} | {ratio:.2f} |", flush=True)
        print(f"c (draft / target at 1 token), {dtype} {label}: {rows['draft'][1] / rows['target'][1]:.2f}", flush=True)
        del generator, draft
        gc.collect()


if __name__ == "__main__":
    main()
