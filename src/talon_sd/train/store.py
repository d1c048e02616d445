"""Work-folder bookkeeping shared by every stage: settings checks, append-only JSONL, atomic files.

Contract
--------
* :func:`check_settings` guards a stage folder: the first call writes ``settings.json``; a later call
  with different settings raises a one-line :class:`TalonError` naming the changed fields, so a resumed
  stage never mixes two runs.
* :class:`JsonlLog` is append-only: every :meth:`JsonlLog.append` writes whole lines, flushes and
  fsyncs; a line torn by a kill is dropped (and cut from the file) when the log is opened again.
* :func:`atomic_write_text` and :func:`atomic_target` write to a temporary name in the same folder and
  rename, so a file is either complete or absent.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib

from ..errors import TalonError

SETTINGS_FILE = "settings.json"


def atomic_write_text(path: pathlib.Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file, fsync and a rename."""
    with atomic_target(path) as temporary:
        with open(temporary, "w", encoding="utf-8") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())


@contextlib.contextmanager
def atomic_target(path: pathlib.Path):
    """Yield a temporary path next to ``path``; on success rename it to ``path``, on error delete it."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield temporary
        os.chmod(temporary, 0o644)  # some writers (safetensors) create private files; the work folder is ordinary
        os.replace(temporary, path)
    finally:
        if temporary.exists():
            temporary.unlink()


def read_json(path: pathlib.Path) -> dict | None:
    """The JSON object in ``path``; None when the file is missing or unreadable."""
    try:
        data = json.loads(pathlib.Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def normalized(settings: dict) -> dict:
    """``settings`` as it reads back from JSON (tuples become lists), for comparisons."""
    return json.loads(json.dumps(settings, sort_keys=True, default=str))


def check_settings(folder: pathlib.Path, settings: dict, stage: str, write: bool = True) -> None:
    """Bind ``folder`` to ``settings``: write them on first use (unless ``write`` is False), refuse different
    ones afterwards."""
    folder = pathlib.Path(folder)
    path = folder / SETTINGS_FILE
    wanted = normalized(settings)
    stored = read_json(path)
    if stored is None:
        if write:
            folder.mkdir(parents=True, exist_ok=True)
            atomic_write_text(path, json.dumps(wanted, indent=2, sort_keys=True))
        return
    if stored != wanted:
        changed = changed_fields(stored, wanted)
        shown = ", ".join(changed[:4]) + (f" and {len(changed) - 4} more" if len(changed) > 4 else "")
        raise TalonError(f"work: {folder} holds the {stage} stage of a run with other settings ({shown}); repeat its "
                         f"arguments, add --resume to take them from the folder, or delete {folder} to redo that stage")


def changed_fields(old: dict, new: dict, prefix: str = "") -> list[str]:
    """``name old -> new`` for every leaf that differs (nested dicts flattened with dots)."""
    changed = []
    for key in sorted(set(old) | set(new)):
        before, after = old.get(key), new.get(key)
        if isinstance(before, dict) and isinstance(after, dict):
            changed.extend(changed_fields(before, after, f"{prefix}{key}."))
        elif before != after:
            changed.append(f"{prefix}{key} {_short(before)} -> {_short(after)}")
    return changed


def _short(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


class JsonlLog:
    """Records (JSON objects) in an append-only ``.jsonl`` file; see the module contract."""

    def __init__(self, path: pathlib.Path) -> None:
        self.path = pathlib.Path(path)
        self.records: list[dict] = []
        if not self.path.exists():
            return
        raw = self.path.read_bytes()
        good = 0  # bytes of complete, parseable lines
        for line in raw.splitlines(keepends=True):
            try:
                record = json.loads(line)
            except ValueError:
                break
            if not line.endswith(b"\n") or not isinstance(record, dict):
                break
            self.records.append(record)
            good += len(line)
        if good != len(raw):  # a torn tail: keep the complete lines only
            with atomic_target(self.path) as temporary:
                temporary.write_bytes(raw[:good])

    def append(self, *records: dict) -> None:
        """Append ``records`` (one line each), flushed and fsynced before returning."""
        if not records:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as stream:
            for record in records:
                stream.write(json.dumps(record, ensure_ascii=False) + "\n")
            stream.flush()
            os.fsync(stream.fileno())
        self.records.extend(records)

    def rewrite(self, records: list[dict]) -> None:
        """Replace the whole log by ``records`` (atomically)."""
        text = "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records)
        atomic_write_text(self.path, text)
        self.records = list(records)
