"""Resumable benchmark runs: every finished prompt turn is appended to ``checkpoint.jsonl``.

A full benchmark on a 2-core CPU takes hours; a crash, a closed terminal or a time limit must not
throw the finished part away. :class:`Checkpoint` is the runner's only persistence:

* line 1 is a header ``{"checkpoint": SCHEMA, "fingerprint": {...}}``; the fingerprint holds every
  setting that changes what is generated (models, dtype, device, decoding, variants, prompts), so a
  resume with different settings is refused (one-line :class:`TalonError`) instead of mixing runs;
* every later line is one :class:`SampleRecord` (one variant on one prompt turn), written and
  flushed when all the variants of that prompt turn have finished, so that a prompt turn is either
  complete in the file or absent (a torn last line from a kill is ignored).

``talon bench --resume --out DIR`` reloads the complete prompt turns and runs only the rest; the
reloaded samples keep the timings measured when they ran (``settings.resumed_samples`` says how
many), and the interleaving contract of :mod:`.runner` holds within every prompt turn.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from collections import Counter, defaultdict
from typing import Sequence

from ..errors import TalonError
from ..stats import DecodeStats
from .methods import Outcome
from .runner import SampleRecord

SCHEMA = "talon-sd/checkpoint/1"
FILE_NAME = "checkpoint.jsonl"


class Checkpoint:
    """Append-only record of complete prompt turns in ``out_dir/checkpoint.jsonl``.

    ``resume=True`` loads the complete prompt turns of an existing file whose fingerprint equals
    ``fingerprint`` (a missing file is a fresh start). ``resume=False`` starts a fresh file, except
    that an *unfinished* run with the same settings (fewer than ``planned`` prompt turns) is never
    thrown away silently: that is a TalonError asking for ``--resume`` or another folder. ``done``
    maps a sample index to its records, in variant order.
    """

    def __init__(self, out_dir: pathlib.Path, fingerprint: dict, resume: bool, variant_labels: Sequence[str],
                 planned: int) -> None:
        self.path = pathlib.Path(out_dir) / FILE_NAME
        self.fingerprint = json.loads(json.dumps(fingerprint, default=str))
        self.done: dict[int, list[SampleRecord]] = {}
        if not resume and self.path.exists():
            try:
                finished = len(self._load(list(variant_labels)))
            except TalonError:
                finished = None  # another run's checkpoint: replaced
            if finished is not None and 0 < finished < planned:
                raise TalonError(f"out: {self.path} holds an unfinished run with these settings ({finished} of "
                                 f"{planned} prompt turns); add --resume to continue it, or choose another --out")
        if resume and self.path.exists():
            self.done = self._load(list(variant_labels))
            self._rewrite()  # drop any torn or partial prompt turn before appending
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._write_lines([self._header()], mode="w")

    def append(self, records: Sequence[SampleRecord]) -> None:
        """Persist the records of one complete prompt turn (flushed and synced)."""
        self._write_lines([record_to_json(r) for r in records], mode="a")

    # ------------------------------------------------------------------------------------------ internals

    def _header(self) -> dict:
        return {"checkpoint": SCHEMA, "fingerprint": self.fingerprint}

    def _load(self, labels: list[str]) -> dict[int, list[SampleRecord]]:
        lines = self.path.read_text(encoding="utf-8").splitlines()
        try:
            header = json.loads(lines[0]) if lines else {}
        except json.JSONDecodeError:
            header = {}
        if header.get("checkpoint") != SCHEMA:
            raise TalonError(f"resume: {self.path} is not a talon-sd checkpoint ({SCHEMA})")
        if header.get("fingerprint") != self.fingerprint:
            changed = sorted(k for k in set(header.get("fingerprint", {})) | set(self.fingerprint)
                             if header.get("fingerprint", {}).get(k) != self.fingerprint.get(k))
            raise TalonError(f"resume: {self.path} was written with different settings ({', '.join(changed)}); "
                             "use the same arguments, or a new --out folder")
        by_index: dict[int, dict[str, SampleRecord]] = defaultdict(dict)
        for line in lines[1:]:
            try:
                record = record_from_json(json.loads(line))
            except (json.JSONDecodeError, KeyError, TypeError):
                continue  # a line torn by a kill
            by_index[record.index][record.label] = record
        return {index: [found[label] for label in labels] for index, found in sorted(by_index.items())
                if set(found) == set(labels)}

    def _rewrite(self) -> None:
        lines = [self._header()] + [record_to_json(r) for index in sorted(self.done) for r in self.done[index]]
        self._write_lines(lines, mode="w")

    def _write_lines(self, objects: list[dict], mode: str) -> None:
        with open(self.path, mode, encoding="utf-8") as stream:
            for obj in objects:
                stream.write(json.dumps(obj, ensure_ascii=False) + "\n")
            stream.flush()
            os.fsync(stream.fileno())


def record_to_json(record: SampleRecord) -> dict:
    """Everything needed to rebuild ``record`` exactly (stats with their raw counters)."""
    stats = None
    if record.outcome.stats is not None:
        stats = {f.name: getattr(record.outcome.stats, f.name) for f in dataclasses.fields(DecodeStats)
                 if f.name != "started"}
        stats["accepted_lengths"] = {str(k): v for k, v in stats["accepted_lengths"].items()}
    return {
        "index": record.index, "dataset": record.dataset, "question_id": record.question_id, "turn": record.turn,
        "label": record.label, "method": record.method, "prompt_tokens": record.prompt_tokens, "seed": record.seed,
        "token_ids": record.outcome.token_ids, "seconds": record.outcome.seconds, "stats": stats,
        "text": record.text, "identical_to_ar": record.identical_to_ar,
        **({"round_seconds": record.round_seconds} if record.round_seconds is not None else {}),
    }


def record_from_json(obj: dict) -> SampleRecord:
    """Inverse of :func:`record_to_json`."""
    stats = None
    if obj["stats"] is not None:
        fields = dict(obj["stats"])
        fields["accepted_lengths"] = Counter({int(k): v for k, v in fields["accepted_lengths"].items()})
        stats = DecodeStats(**fields)
    outcome = Outcome(token_ids=[int(t) for t in obj["token_ids"]], seconds=float(obj["seconds"]), stats=stats)
    return SampleRecord(
        index=int(obj["index"]), dataset=obj["dataset"], question_id=str(obj["question_id"]), turn=int(obj["turn"]),
        label=obj["label"], method=obj["method"], prompt_tokens=int(obj["prompt_tokens"]), seed=int(obj["seed"]),
        outcome=outcome, text=obj["text"], identical_to_ar=obj["identical_to_ar"],
        round_seconds=[float(x) for x in obj["round_seconds"]] if obj.get("round_seconds") is not None else None,
    )
