"""Seed a data stage from two finished ones: the code requests' answers, then the self-written ones.

    python training/merge_data.py runs/head-q15-mix/data

writes ``prompts.jsonl`` and ``samples.jsonl`` in the layout the data stage itself keeps (prompts from
``--prompts`` first, index 0 .. 254, then the self-written requests, index 255 .. 854), so that

    talon train-head ... --prompts training/head-qwen2.5-coder-1.5b-instruct/data/prompts.jsonl \
        --self-prompts 600 --source-prompts 0 --max-new-tokens 256 --stage data --work runs/head-q15-mix

finds every request answered, binds the folder to those settings and finishes without generating.
Both sources were answered the same way (the target's greedy bf16 answers, up to 256 new tokens), so
the result is what that command would have produced from an empty folder, minus the hours.
"""

from __future__ import annotations

import json
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
SOURCES = (HERE / "head-q15-answers", HERE / "head-q15-chat-data")  # file prompts first, then self


def read_jsonl(path: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main(out: pathlib.Path) -> None:
    if (out / "prompts.jsonl").exists() or (out / "samples.jsonl").exists():
        sys.exit(f"merge_data: {out} already holds a data stage; delete it first")
    prompts, samples, offset = [], [], 0
    for source in SOURCES:
        source_prompts = sorted(read_jsonl(source / "prompts.jsonl"), key=lambda r: r["index"])
        if [r["index"] for r in source_prompts] != list(range(len(source_prompts))):
            sys.exit(f"merge_data: {source}/prompts.jsonl is not indexed 0 .. n-1")
        answered = {r["index"]: r for r in read_jsonl(source / "samples.jsonl")}
        if set(answered) != {r["index"] for r in source_prompts}:
            sys.exit(f"merge_data: {source}/samples.jsonl does not answer every prompt once")
        prompts += [r | {"index": r["index"] + offset} for r in source_prompts]
        samples += [answered[r["index"]] | {"index": r["index"] + offset} for r in source_prompts]
        offset += len(source_prompts)
    if [r["source"] for r in prompts] != sorted((r["source"] for r in prompts), key=lambda s: s == "self"):
        sys.exit("merge_data: the data stage keeps --prompts requests before self-written ones")
    out.mkdir(parents=True, exist_ok=True)
    for name, records in (("prompts.jsonl", prompts), ("samples.jsonl", samples)):
        (out / name).write_text("".join(json.dumps(r) + "\n" for r in records))
    print(f"{out}: {len(prompts)} prompts, {sum(len(r.get('ids', ())) for r in samples)} tokens")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python training/merge_data.py WORK/data")
    main(pathlib.Path(sys.argv[1]))
