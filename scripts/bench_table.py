"""The markdown tables of docs/BENCHMARKS.md, generated from the results.json files they cite.

Per dataset (and ``all``): plain decoding's tokens per second, then every other variant's speed over it (from the
same run), with MAT / delta of the variants named by ``--detail``. Several results files (e.g. the same sweep at two
commits) give one column group each, headed by ``--names``.

    python scripts/bench_table.py docs/bench/sweep-int8-greedy/results.json --detail auto
    python scripts/bench_table.py RUN_A/results.json RUN_B/results.json --names new,old --detail auto
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re


def short(label: str) -> str:
    """``talon(N=auto,K=4,mu=0.03)`` -> ``auto``; ``talon(N=16,...)`` -> ``N=16``; other labels as they are."""
    found = re.match(r"talon\(N=(\w+),", label)
    return ("auto" if found.group(1) == "auto" else f"N={found.group(1)}") if found else label


def table(paths: list[pathlib.Path], names: list[str], detail: set[str]) -> str:
    runs = [json.loads(path.read_text()) for path in paths]
    rows: dict[str, dict[str, str]] = {}
    columns: list[str] = []
    for name, run in zip(names, runs):
        prefix = f"{name} " if name else ""
        for row in run["summary"]:
            cells = rows.setdefault(row["dataset"], {})
            label = short(row["label"])
            if label == "ar":
                column, value = f"{prefix}ar tok/s", f"{row['tokens_per_s']:.2f}"
            else:
                column, value = f"{prefix}{label}", f"{row['speedup']:.2f}x"
            cells[column] = value
            columns += [column] if column not in columns else []
            if label in detail:
                column = f"{prefix}{label} MAT / delta"
                cells[column] = f"{row['mat']:.2f} / {row['delta']:.2f}"
                columns += [column] if column not in columns else []
    lines = ["| dataset | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    order = [d for d in rows if d != "all"] + (["all"] if "all" in rows else [])
    for dataset in order:
        lines.append(f"| {dataset} | " + " | ".join(rows[dataset].get(c, "-") for c in columns) + " |")
    return "\n".join(lines)


def round_speedups(run: dict) -> dict[str, list[float]]:
    """Each variant's overall speed over ``ar`` in each repeat round (all prompts' tokens over all their seconds in
    that round): the spread between rounds is the noise a difference between two figures must exceed."""
    tokens: dict[str, float] = {}
    seconds: dict[str, list[float]] = {}
    for sample in run["samples"]:
        label = short(sample["label"])
        rounds = sample.get("round_seconds") or [sample["seconds"]]
        tokens[label] = tokens.get(label, 0) + sample["new_tokens"]
        totals = seconds.setdefault(label, [0.0] * len(rounds))
        for index, value in enumerate(rounds[:len(totals)]):
            totals[index] += value
    if "ar" not in seconds:
        return {}
    return {label: [(tokens[label] / s) / (tokens["ar"] / a) for s, a in zip(seconds[label], seconds["ar"])]
            for label in seconds if label != "ar"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=pathlib.Path, nargs="+")
    parser.add_argument("--names", default=None, help="comma-separated column-group names, one per results file")
    parser.add_argument("--detail", default="auto", help="comma-separated variants whose MAT / delta to show")
    args = parser.parse_args()
    names = args.names.split(",") if args.names else [""] * len(args.results)
    if len(names) != len(args.results):
        parser.error("--names: one name per results file")
    print(table(args.results, names, set(args.detail.split(","))))
    for path in args.results:
        run = json.loads(path.read_text())
        machine = run["machine"]
        print(f"\n{path}: `{run['command']}`; {run['created'][:10]}, {machine.get('cpu')} ({machine.get('isa', '?')}), "
              f"{run['settings']['dtype']}, {run['settings']['threads']} threads, commit {run.get('versions', {}).get('git_revision', '?')[:7]}")
        rounds = round_speedups(run)
        if rounds and len(next(iter(rounds.values()))) > 1:
            print("overall speed-up over ar in each repeat round: "
                  + "; ".join(f"{label} " + " / ".join(f"{x:.2f}" for x in values) for label, values in rounds.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
