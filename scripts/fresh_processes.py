"""README command (1) as a user runs it: one fresh ``talon generate`` process per request, side by side.

Each round runs, one after the other on the same prompt, ``--tree ar``, the default (``talon``, budget auto,
starting from the controller memory of the rounds before: :mod:`talon_sd.controller_memory`) and the
default with ``--fresh-controller``; prompts alternate between ``--prompts``. The memory is cleared
before round 1 (so round 1's two talon runs both start afresh). Prints one row per round and the
medians of rounds 2.. (tok/s include the prefill, as ``talon generate`` reports them).

    python scripts/fresh_processes.py --rounds 6 --max-new-tokens 128 --out /tmp/fresh

Every process loads the models anew (about 20 s, not counted in tok/s); the machine's own drift between
processes is part of what this measures, so read medians over several rounds, never one row. With
``--bracket`` each round ends with a second ``--tree ar`` process and every ratio is taken against the mean
of the two (drift during a round then biases no variant), and the seconds per plain verify step of each
talon run are printed beside ar's (a mostly plain run shows whether its process decodes slower).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import statistics
import subprocess
import sys

VARIANTS = {"ar": ["--tree", "ar"], "talon": [], "fresh": ["--fresh-controller"]}
PROMPTS = ("Write a Python function that reverses a string.", "Explain what a hash table is and when to use one.")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--prompts", nargs="+", default=list(PROMPTS))
    parser.add_argument("--out", required=True, help="folder for each process's --json output")
    parser.add_argument("--keep-memory", action="store_true", help="do not clear the controller memory first")
    parser.add_argument("--bracket", action="store_true", help="a second ar process ends each round; ratios "
                        "against the mean of both")
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.keep_memory:
        from talon_sd.models import cache_dir

        shutil.rmtree(cache_dir() / "controllers", ignore_errors=True)
    ratios: dict[str, list[float]] = {"talon": [], "fresh": []}
    print("round | prompt | ar tok/s | talon (memory) tok/s, x ar, steps (plain), draft s "
          "| talon --fresh-controller tok/s, x ar, steps (plain), draft s")
    variants = dict(VARIANTS, **({"ar2": VARIANTS["ar"]} if args.bracket else {}))
    for index in range(1, args.rounds + 1):
        prompt = args.prompts[(index - 1) % len(args.prompts)]
        runs = {}  # variant -> its --json output
        for name, flags in variants.items():
            path = out / f"round{index}_{name}.json"
            command = ["talon", "generate", prompt, "--max-new-tokens", str(args.max_new_tokens), "--json", *flags]
            with open(path, "w") as handle:
                subprocess.run(command, stdout=handle, stderr=subprocess.DEVNULL, check=True)
            runs[name] = json.loads(path.read_text())
        stats = {name: run["stats"] for name, run in runs.items()}
        plains = [stats[name] for name in ("ar", "ar2") if name in stats]
        plain_rate = statistics.mean(s["new_tokens"] / s["seconds_total"] for s in plains)
        ar_step = statistics.mean(s["seconds_verify"] / s["target_forwards"] for s in plains)
        ar_kernels = runs["ar"].get("cpu_kernels", {})
        cells = [str(index), str((index - 1) % len(args.prompts) + 1),
                 f"{plain_rate:.2f}" + ("" if ar_kernels.get("target") in (None, "packed") else f" [kernels {ar_kernels}]")]
        for name in ("talon", "fresh"):
            s = stats[name]
            rate = s["new_tokens"] / s["seconds_total"]
            if index > 1:
                ratios[name].append(rate / plain_rate)
            plain_steps = s["budget_hist"].get("1", 0)
            kernels = runs[name].get("cpu_kernels", {})
            unpacked = "" if all(v in (None, "packed") for v in kernels.values()) else f" [kernels {kernels}]"
            cells.append(f"{rate:.2f}, {rate / plain_rate:.2f}x, {s['target_forwards']} ({plain_steps}), "
                         f"{s['seconds_draft']:.1f}{unpacked}")
            if args.bracket:
                cells[-1] += f", verify/step {s['seconds_verify'] / s['target_forwards']:.3f} (ar {ar_step:.3f})"
        print(" | ".join(cells), flush=True)
    if args.rounds > 1:
        print(f"median of rounds 2-{args.rounds}: talon (memory) {statistics.median(ratios['talon']):.2f}x ar, "
              f"talon --fresh-controller {statistics.median(ratios['fresh']):.2f}x ar")
    return 0


if __name__ == "__main__":
    sys.exit(main())
