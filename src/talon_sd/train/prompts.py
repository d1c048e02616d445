"""Where training prompts come from: user files, the target itself (Magpie), local source code.

* **User files** (``--prompts FILE.jsonl``): one JSON object per line with ``"turns": [str, ...]``
  (the first turn is used: a later turn needs the answer to the earlier one) or ``"prompt": str``
  (or ``"text": str``, as in a data stage's own ``prompts.jsonl``, so one run's prompts seed another).
* **Self-generated requests** (Xu et al., "Magpie", 2024): the target sees only its chat template's
  user-turn prefix (e.g. ``<|im_start|>system\\n...<|im_end|>\\n<|im_start|>user\\n``, found by
  rendering a sentinel user message and cutting at the sentinel) and samples until end of turn
  (temperature 1, top-p 0.95); requests that ended, are non-trivial and new are kept. Batches take
  turns between the template's own prefix and prefixes with a topic system prompt
  (:data:`REQUEST_SYSTEM_PROMPTS`: code, math, summaries, facts, writing, explanations), which steers
  the requests away from the default prompt's favourite topic (itself). Only the request is kept: the
  answer is generated with the template's default system prompt, as ``talon generate`` sends it.
* **Source-seeded requests**: functions and classes of local ``.py`` files (the standard library by
  default) wrapped in tasks such as "Explain what this code does" or "Write unit tests for".

The six benchmark prompt sets (``talon_sd/data``) are never training data: a user file that holds one
of their prompts is refused, a generated request equal to one is dropped (:class:`PromptPool`).
"""

from __future__ import annotations

import ast
import json
import pathlib
import random
import re
import sysconfig
import textwrap

from ..errors import TalonError

SENTINEL = "TALONSENTINEL4217"
MIN_REQUEST_CHARS = 16
MIN_REQUEST_WORDS = 3
SNIPPET_LINES = (5, 40)  # inclusive range of lines a source snippet may have
SNIPPET_MAX_CHARS = 1600
SNIPPETS_PER_FILE = 2

REQUEST_SYSTEM_PROMPTS = (
    None,  # the template's own default
    "You are a helpful assistant. The user asks you to write, fix or explain Python code.",
    "You are a helpful assistant. The user gives you a math word problem to solve step by step.",
    "You are a helpful assistant. The user pastes a short text and asks you to summarize it.",
    "You are a helpful assistant. The user asks you a factual question about the world.",
    "You are a helpful assistant. The user asks you to write, rewrite or edit a piece of text.",
    "You are a helpful assistant. The user asks you to explain an idea from science, history or technology.",
)

SOURCE_TASKS = (
    "Explain what this code does:\n```python\n{code}\n```",
    "Write unit tests for this code with pytest:\n```python\n{code}\n```",
    "Refactor this code to make it clearer, and explain your changes:\n```python\n{code}\n```",
    "Add type hints and a docstring to this code:\n```python\n{code}\n```",
    "Find possible bugs or unhandled edge cases in this code:\n```python\n{code}\n```",
    "Rewrite this code in a more idiomatic way:\n```python\n{code}\n```",
)


def normalize(text: str) -> str:
    """The key prompts are compared by: lower case, whitespace collapsed."""
    return " ".join(text.lower().split())


def benchmark_keys() -> set[str]:
    """Normalized turns of the six packaged benchmark sets."""
    from ..bench.datasets import DATASETS, packaged_path

    keys = set()
    for name in DATASETS:
        path = packaged_path(name)
        if not path.is_file():
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                turns = json.loads(line).get("turns") or []
            except (ValueError, AttributeError):
                continue
            keys.update(normalize(turn) for turn in turns if isinstance(turn, str))
    return keys


class PromptPool:
    """De-duplicates prompts and keeps benchmark prompts out (normalized text comparison)."""

    def __init__(self) -> None:
        self.benchmark = benchmark_keys()
        self.seen: set[str] = set()

    def is_benchmark(self, text: str) -> bool:
        return normalize(text) in self.benchmark

    def add(self, text: str) -> bool:
        """True when ``text`` is new and not a benchmark prompt (it is then remembered)."""
        key = normalize(text)
        if not key or key in self.seen or key in self.benchmark:
            return False
        self.seen.add(key)
        return True


def read_prompt_file(path: str | pathlib.Path, pool: PromptPool) -> list[str]:
    """The prompts of one user JSONL file, in order; one-line TalonError for unreadable files or lines and
    for files that hold benchmark prompts."""
    file = pathlib.Path(path).expanduser()
    try:
        lines = file.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise TalonError(f"prompts: cannot read {str(path)!r} ({error.__class__.__name__})") from None
    prompts = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            raise TalonError(f"prompts: {file}:{number} is not JSON") from None
        text = _prompt_text(record)
        if text is None:
            raise TalonError(f"prompts: {file}:{number} has no \"turns\": [str, ...], \"prompt\": str or \"text\": str")
        if pool.is_benchmark(text):
            raise TalonError(f"prompts: {file}:{number} is a prompt of the benchmark sets (talon_sd/data); "
                             "benchmark prompts are never used for training")
        prompts.append(text)
    if not prompts:
        raise TalonError(f"prompts: {file} holds no prompts")
    return prompts


def _prompt_text(record) -> str | None:
    if not isinstance(record, dict):
        return None
    turns = record.get("turns")
    if isinstance(turns, list) and turns and isinstance(turns[0], str) and turns[0].strip():
        return turns[0]
    prompt = record.get("prompt", record.get("text"))  # "text": a data stage's own prompts.jsonl
    return prompt if isinstance(prompt, str) and prompt.strip() else None


# ------------------------------------------------------------------------------------------ Magpie


def render_user_turn(tokenizer, text: str, generation_prompt: bool) -> list[int]:
    """Token ids of the chat template applied to one user message (the generator's encoding)."""
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=generation_prompt,
                                        tokenize=True)
    if hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return [int(i) for i in ids]


def user_turn_prefix(tokenizer, system: str | None = None) -> list[int]:
    """Token ids of everything the chat template puts before a user message's text (after a ``system``
    message when one is given)."""
    if not getattr(tokenizer, "chat_template", None):
        raise TalonError("target: its tokenizer has no chat template (train-head renders every prompt with it)")
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": SENTINEL}]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    if SENTINEL not in rendered:
        raise TalonError("target: its chat template does not show the user message verbatim (cannot find the user-turn prefix)")
    prefix = rendered[: rendered.index(SENTINEL)]
    return [int(i) for i in tokenizer(prefix, add_special_tokens=False)["input_ids"]]


def request_prefixes(tokenizer) -> list[list[int]]:
    """The distinct user-turn prefixes of :data:`REQUEST_SYSTEM_PROMPTS` the template can render (some
    templates refuse a system role: those get the default prefix only)."""
    prefixes = []
    for system in REQUEST_SYSTEM_PROMPTS:
        try:
            prefix = user_turn_prefix(tokenizer, system)
        except TalonError:
            raise
        except Exception:  # a template that raises on a system message
            continue
        if prefix not in prefixes:
            prefixes.append(prefix)
    return prefixes


def clean_request(tokenizer, completion) -> str | None:
    """The text of a sampled request, or None when it is unusable (did not end, trivial, template debris)."""
    if not completion.finished:
        return None
    text = tokenizer.decode(list(completion.tokens), skip_special_tokens=True).strip()
    if SENTINEL in text or "<|" in text or len(text) < MIN_REQUEST_CHARS or len(text.split()) < MIN_REQUEST_WORDS:
        return None
    return text


# ------------------------------------------------------------------------------------------ source code


def default_source_roots() -> tuple[str, ...]:
    """The standard library of the running Python."""
    return (sysconfig.get_paths()["stdlib"],)


def source_prompts(count: int, seed: int, roots: tuple[str, ...], pool: PromptPool) -> list[str]:
    """``count`` requests about functions and classes of the ``.py`` files under ``roots`` (files in a
    seeded random order, at most two snippets each, tasks drawn from :data:`SOURCE_TASKS`)."""
    if count <= 0:
        return []
    files = sorted({path for root in roots for path in _python_files(pathlib.Path(root).expanduser())})
    if not files:
        raise TalonError(f"source: no .py files under {', '.join(roots)}")
    chooser = random.Random(seed)
    chooser.shuffle(files)
    prompts = []
    for file in files:
        for snippet in _snippets(file)[:SNIPPETS_PER_FILE]:
            text = chooser.choice(SOURCE_TASKS).format(code=snippet)
            if pool.add(text):
                prompts.append(text)
            if len(prompts) == count:
                return prompts
    return prompts


def _python_files(root: pathlib.Path):
    skipped = {"site-packages", "dist-packages", "test", "tests", "__pycache__", "idlelib", "lib2to3"}
    for path in root.rglob("*.py"):
        if not skipped.intersection(path.relative_to(root).parts[:-1]):
            yield path


def _snippets(file: pathlib.Path) -> list[str]:
    """Top-level functions and classes of ``file`` of a readable size, in file order."""
    try:
        source = file.read_text(encoding="utf-8")
        tree = ast.parse(source)
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return []
    lines = source.splitlines()
    snippets = []
    for node in tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        start = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
        text = textwrap.dedent("\n".join(lines[start: node.end_lineno])).strip("\n")
        count = text.count("\n") + 1
        if SNIPPET_LINES[0] <= count <= SNIPPET_LINES[1] and len(text) <= SNIPPET_MAX_CHARS and not re.search(r"[^\x00-\x7f]", text):
            snippets.append(text)
    return snippets
