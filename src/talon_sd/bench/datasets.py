"""Benchmark prompts: the six packaged prompt sets and user JSONL files in the same schema.

Contract
--------
A prompt file holds one JSON object per line with a non-empty ``turns`` list of strings (user
messages); ``question_id`` and ``category`` are optional, any other key (``reference``) is ignored.
A prompt with several turns (MT-Bench) is a multi-turn conversation: the benchmark answers turn 1,
then sends turn 2 after that answer (see :mod:`talon_sd.bench.runner`).

The six sets of the TALON paper ship inside the package under ``talon_sd/data/<name>/question.jsonl``
(copied from SafeAILab/EAGLE, Apache-2.0; attribution in ``talon_sd/data/SOURCES.md``).
``--limit N`` keeps the first N prompts of each set, so every run sees the same prompts.

Every mistake raises a one-line :class:`~talon_sd.errors.TalonError` naming the argument
(``datasets``, ``data``, ``limit``).
"""

from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass
from importlib import resources
from typing import Iterable, Sequence

from ..errors import TalonError, bad_argument

DATASETS = ("mt_bench", "alpaca", "gsm8k", "humaneval", "sum", "qa")


@dataclass(frozen=True)
class Prompt:
    """One benchmark prompt: text ``turns`` (user messages), or raw ``input_ids`` (one turn, no tokenizer)."""

    dataset: str
    question_id: str
    category: str = ""
    turns: tuple[str, ...] = ()
    input_ids: tuple[int, ...] | None = None

    @property
    def num_turns(self) -> int:
        return 1 if self.input_ids is not None else len(self.turns)


def split_list(text: str | Sequence[str] | None) -> list[str]:
    """``"a,b, c"`` or ``["a", "b"]`` -> ``["a", "b", "c"]`` (empty items dropped)."""
    if text is None:
        return []
    items = text.split(",") if isinstance(text, str) else list(text)
    return [item.strip() for item in items if item and item.strip()]


def parse_dataset_names(text: str | Sequence[str] | None) -> list[str]:
    """Validated packaged dataset names, in the order given, without duplicates; ``all`` = the six."""
    names = split_list(text)
    if names == ["all"]:
        return list(DATASETS)
    for name in names:
        if name not in DATASETS:
            raise bad_argument("datasets", name, "some of " + ", ".join(DATASETS) + " (comma-separated) or all")
    return list(dict.fromkeys(names))


def check_limit(limit: int | None) -> None:
    """``limit`` is None (every prompt) or an integer >= 1."""
    if limit is None:
        return
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise bad_argument("limit", limit, "an integer >= 1 (prompts per dataset)")


def packaged_path(name: str) -> pathlib.Path:
    """Where the packaged prompt set ``name`` lives."""
    if name not in DATASETS:
        raise bad_argument("datasets", name, "some of " + ", ".join(DATASETS))
    return pathlib.Path(str(resources.files("talon_sd").joinpath("data", name, "question.jsonl")))


def load_jsonl(path: str | pathlib.Path, limit: int | None = None, name: str | None = None,
               argument: str = "data") -> list[Prompt]:
    """Prompts of a JSONL file (see the module contract); ``name`` defaults to the file stem."""
    check_limit(limit)
    path = pathlib.Path(path).expanduser()
    dataset = name or path.stem
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else type(error).__name__
        raise TalonError(f"{argument}: cannot read {str(path)!r} ({reason})") from None
    prompts: list[Prompt] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        prompts.append(_parse_line(line, number, path, dataset, argument))
        if limit is not None and len(prompts) >= limit:
            break
    if not prompts:
        raise TalonError(f"{argument}: {str(path)!r} holds no prompt (expected JSON lines with a 'turns' list)")
    return prompts


def _parse_line(line: str, number: int, path: pathlib.Path, dataset: str, argument: str) -> Prompt:
    expected = "a JSON object with a non-empty 'turns' list of strings"
    try:
        row = json.loads(line)
    except ValueError:
        raise TalonError(f"{argument}: line {number} of {str(path)!r} is not valid JSON (expected {expected})") from None
    turns = row.get("turns") if isinstance(row, dict) else None
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t.strip() for t in turns):
        raise TalonError(f"{argument}: line {number} of {str(path)!r} is not {expected}")
    return Prompt(
        dataset=dataset,
        question_id=str(row.get("question_id", number)),
        category=str(row.get("category", "")),
        turns=tuple(turns),
    )


def load_prompts(datasets: Iterable[str] = (), limit: int | None = None,
                 data_files: Iterable[str | pathlib.Path] = ()) -> list[Prompt]:
    """The first ``limit`` prompts of each packaged dataset, then of each data file, grouped by dataset."""
    check_limit(limit)
    names = parse_dataset_names(list(datasets))
    files = [pathlib.Path(f) for f in data_files]
    if not names and not files:
        raise TalonError("datasets: none chosen (expected some of " + ", ".join(DATASETS) + ", or --data FILE.jsonl)")
    prompts: list[Prompt] = []
    for name in names:
        prompts.extend(load_jsonl(packaged_path(name), limit, name=name, argument="datasets"))
    taken = set(names)
    for file in files:
        name = file.stem
        while name in taken:  # two files with one stem, or a file named like a packaged set
            name += "+"
        taken.add(name)
        prompts.extend(load_jsonl(file, limit, name=name))
    return prompts


def prompts_from_ids(dataset: str, id_lists: Sequence[Sequence[int]]) -> list[Prompt]:
    """Single-turn prompts given as token ids (for generators without a tokenizer, e.g. tiny test models)."""
    if not id_lists:
        raise bad_argument("prompts", [], "at least one list of token ids")
    return [Prompt(dataset=dataset, question_id=str(i), input_ids=tuple(int(t) for t in ids))
            for i, ids in enumerate(id_lists)]
