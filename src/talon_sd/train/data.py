"""The data stage: prompts (:mod:`.prompts`) answered by the target, stored as token ids + loss mask.

Folder layout (``<work>/data``), every file resumable::

    settings.json    what the stage was run with (a different run is refused, see :mod:`.store`)
    prompts.jsonl    {"index", "source": "file" | "source" | "self", "text"[, "batch", "seconds"]}, append-only
    samples.jsonl    {"index", "ids", "loss_mask", "prompt_tokens", "finished", "seconds"} or {"index", "skipped"}
    summary.json     written last: the stage is finished (``seconds``: generation time summed over the
                     records, so over every run that contributed)

A sample is the target's chat template around one user prompt followed by the target's answer
(greedy by default, cut after the first end-of-turn id, at most ``max_new_tokens``); ``loss_mask`` is 1
on the answer tokens (the end-of-turn id included), 0 on the prompt. Prompts are collected in a fixed
order (user files, source code, then Magpie requests sampled in seeded batches), answered shortest
first in batches of ``batch_size`` with left padding; a rerun skips every prompt and answer on disk.
"""

from __future__ import annotations

import hashlib
import json
import math
import pathlib
import time
import warnings
from dataclasses import asdict, dataclass

from ..errors import TalonError, TalonWarning, bad_argument
from .generation import MAX_PREFILL_TOKENS, generate_batch, pad_token_id, stop_token_ids
from .prompts import (
    PromptPool, clean_request, default_source_roots, read_prompt_file, render_user_turn, request_prefixes, source_prompts,
)
from .store import JsonlLog, atomic_write_text, check_settings, read_json

REQUEST_TOP_P = 0.95
REQUEST_TEMPERATURE = 1.0
MAX_REQUEST_BATCH_FACTOR = 6  # Magpie gives up after 6x the batches a 100% yield would need


@dataclass(frozen=True)
class DataConfig:
    """What the data stage makes; CLI flags map one-to-one onto the fields."""

    prompt_files: tuple[str, ...] = ()  # --prompts
    self_prompts: int = 0  # --self-prompts: Magpie requests
    source_prompts: int = 0  # --source-prompts: requests about local code
    source_roots: tuple[str, ...] = ()  # --source-dir; () = the standard library
    max_new_tokens: int = 256  # --max-new-tokens: answer length cap
    max_request_tokens: int = 160  # --max-request-tokens: Magpie request length cap
    max_prompt_tokens: int = 1024  # rendered prompts longer than this are skipped
    batch_size: int = 16  # --gen-batch: sequences per generate call
    answer_temperature: float = 0.0  # --answer-temperature: 0 = greedy
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("self_prompts", "source_prompts"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise bad_argument(name.replace("_", "-"), value, "an integer >= 0")
        for name in ("max_new_tokens", "max_request_tokens", "max_prompt_tokens", "batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise bad_argument(name.replace("_", "-"), value, "an integer >= 1")
        if not 0 <= self.answer_temperature <= 2:
            raise bad_argument("answer-temperature", self.answer_temperature, "a number in [0, 2] (0 = greedy)")
        if not self.prompt_files and not self.self_prompts and not self.source_prompts:
            raise TalonError("prompts: no prompt source (give --prompts FILE, --self-prompts N or --source-prompts N)")
        for path in self.prompt_files:
            if not pathlib.Path(path).expanduser().is_file():
                raise bad_argument("prompts", path, "a JSONL file of {\"turns\": [...]} or {\"prompt\": ...} objects")

    def settings(self) -> dict:
        """The fields plus a hash of every prompt file (an edited file is another run)."""
        hashes = {path: hashlib.sha256(pathlib.Path(path).expanduser().read_bytes()).hexdigest()[:16]
                  for path in self.prompt_files}
        return asdict(self) | {"prompt_file_sha256": hashes}


@dataclass(frozen=True)
class Sample:
    """One training sequence: prompt (chat template) + answer."""

    index: int  # the prompt's index
    ids: tuple[int, ...]  # [T]
    loss_mask: tuple[int, ...]  # [T], 1 on answer tokens


@dataclass(frozen=True)
class DataSummary:
    samples: int
    tokens: int
    answer_tokens: int
    skipped: int
    prompts_by_source: dict
    seconds: float


def build_data(model, tokenizer, config: DataConfig, folder: pathlib.Path, upstream: dict,
               progress: bool = True) -> DataSummary:
    """Run (or finish) the data stage in ``folder``. ``upstream`` identifies the model (target, dtype); with
    ``config.settings()`` under "data" it is what the folder is bound to."""
    folder = pathlib.Path(folder)
    check_settings(folder, upstream | {"data": config.settings()}, "data")
    done = read_json(folder / "summary.json")
    if done is not None:
        return DataSummary(**done)
    prompts = collect_prompts(model, tokenizer, config, folder, progress)
    answer_prompts(model, tokenizer, config, folder, prompts, progress)
    samples_log = JsonlLog(folder / "samples.jsonl")
    samples = [record for record in samples_log.records if "ids" in record]
    by_source: dict[str, int] = {}
    for record in prompts:
        by_source[record["source"]] = by_source.get(record["source"], 0) + 1
    summary = DataSummary(
        samples=len(samples), tokens=sum(len(r["ids"]) for r in samples),
        answer_tokens=sum(sum(r["loss_mask"]) for r in samples), skipped=len(samples_log.records) - len(samples),
        prompts_by_source=by_source,
        seconds=round(sum(r.get("seconds", 0.0) for r in prompts + samples_log.records), 1),
    )
    if not samples:
        raise TalonError("data: no usable sample (every prompt was skipped); give shorter or more prompts")
    atomic_write_text(folder / "summary.json", json.dumps(asdict(summary), indent=2))
    return summary


def collect_prompts(model, tokenizer, config: DataConfig, folder: pathlib.Path, progress: bool) -> list[dict]:
    """Every prompt of the run, from ``prompts.jsonl`` plus whatever is still missing."""
    from tqdm.auto import tqdm

    log = JsonlLog(folder / "prompts.jsonl")
    pool = PromptPool()
    fixed = [("file", text) for path in config.prompt_files for text in read_prompt_file(path, pool) if pool.add(text)]
    roots = config.source_roots or default_source_roots()
    fixed += [("source", text) for text in source_prompts(config.source_prompts, config.seed, roots, pool)]
    logged_fixed = [r for r in log.records if r["source"] != "self"]
    missing = [{"index": i, "source": source, "text": text} for i, (source, text) in enumerate(fixed)
               if i >= len(logged_fixed)]
    if missing and any(r["source"] == "self" for r in log.records):
        raise TalonError(f"work: {folder / 'prompts.jsonl'} does not match these prompt sources; delete {folder} to redo the data stage")
    log.append(*missing)
    selves = [r for r in log.records if r["source"] == "self"]
    for record in selves:
        pool.add(record["text"])
    if len(selves) < config.self_prompts:
        prefixes = request_prefixes(tokenizer)
        stop = stop_token_ids(model, tokenizer)
        batch = max((r["batch"] for r in selves), default=-1) + 1
        last_batch = batch + MAX_REQUEST_BATCH_FACTOR * math.ceil((config.self_prompts - len(selves)) / config.batch_size)
        bar = tqdm(total=config.self_prompts, initial=len(selves), desc="requests (self)", unit="prompt", disable=not progress)
        while len(selves) < config.self_prompts and batch < last_batch:
            started = time.perf_counter()
            prefix = prefixes[batch % len(prefixes)]
            completions = generate_batch(model, [prefix] * config.batch_size, config.max_request_tokens,
                                         REQUEST_TEMPERATURE, REQUEST_TOP_P, stop, pad_token_id(tokenizer, stop),
                                         seed=config.seed * 1_000_003 + batch)
            kept = []
            for completion in completions:
                text = clean_request(tokenizer, completion)
                if text is not None and len(selves) + len(kept) < config.self_prompts and pool.add(text):
                    kept.append({"index": len(log.records) + len(kept), "source": "self", "text": text, "batch": batch})
            for record in kept:  # the batch's time, shared by the requests it gave
                record["seconds"] = round((time.perf_counter() - started) / len(kept), 3)
            log.append(*kept)
            selves += kept
            bar.update(len(kept))
            batch += 1
        bar.close()
        if len(selves) < config.self_prompts:
            warnings.warn(f"self-prompts: kept {len(selves)} of {config.self_prompts} requests (the target repeats "
                          "itself or rarely ends its turn); continuing with those", TalonWarning, stacklevel=2)
    return sorted(log.records, key=lambda r: r["index"])


def answer_prompts(model, tokenizer, config: DataConfig, folder: pathlib.Path, prompts: list[dict], progress: bool) -> None:
    """Append a sample (or a skip) to ``samples.jsonl`` for every prompt that has none yet. Prompts are
    answered shortest first, so a batch pads little (and holds at most MAX_PREFILL_TOKENS padded tokens)."""
    from tqdm.auto import tqdm

    log = JsonlLog(folder / "samples.jsonl")
    answered = {record["index"] for record in log.records}
    pending = [(record, render_user_turn(tokenizer, record["text"], generation_prompt=True))
               for record in prompts if record["index"] not in answered]
    too_long = [{"index": r["index"], "skipped": f"prompt longer than {config.max_prompt_tokens} tokens"}
                for r, ids in pending if len(ids) > config.max_prompt_tokens]
    log.append(*too_long)
    pending = sorted([(r, ids) for r, ids in pending if len(ids) <= config.max_prompt_tokens],
                     key=lambda item: (len(item[1]), item[0]["index"]))
    stop = stop_token_ids(model, tokenizer)
    pad = pad_token_id(tokenizer, stop)
    bar = tqdm(total=len(prompts), initial=len(prompts) - len(pending), desc="answers", unit="prompt", disable=not progress)
    for batch in length_batches(pending, config.batch_size):
        started = time.perf_counter()
        completions = generate_batch(model, [ids for _, ids in batch], config.max_new_tokens, config.answer_temperature,
                                     1.0, stop, pad, seed=config.seed * 1_000_003 + 7919 * batch[0][0]["index"])
        seconds = round((time.perf_counter() - started) / len(batch), 3)
        records = []
        for (record, ids), completion in zip(batch, completions):
            answer = list(completion.tokens)
            records.append({"index": record["index"], "ids": ids + answer, "loss_mask": [0] * len(ids) + [1] * len(answer),
                            "prompt_tokens": len(ids), "finished": completion.finished, "seconds": seconds})
        log.append(*records)
        bar.update(len(batch))
    bar.close()


def length_batches(items: list[tuple[dict, list[int]]], batch_size: int) -> list[list[tuple[dict, list[int]]]]:
    """Consecutive (prompt, ids) items, at most ``batch_size`` a batch and MAX_PREFILL_TOKENS padded tokens
    (items sorted by length: the last one is the widest)."""
    batches, current = [], []
    for item in items:
        if current and (len(current) == batch_size or (len(current) + 1) * len(item[1]) > MAX_PREFILL_TOKENS):
            batches.append(current)
            current = []
        current.append(item)
    if current:
        batches.append(current)
    return batches


def read_samples(folder: pathlib.Path) -> list[Sample]:
    """The samples of a finished data stage, by prompt index; one-line TalonError when it is not finished."""
    folder = pathlib.Path(folder)
    if read_json(folder / "summary.json") is None:
        raise TalonError(f"data: the data stage in {folder} is not finished; run --stage data (or all) first")
    records = [r for r in JsonlLog(folder / "samples.jsonl").records if "ids" in r]
    return [Sample(r["index"], tuple(r["ids"]), tuple(r["loss_mask"])) for r in sorted(records, key=lambda r: r["index"])]
