"""The Python API: :class:`SpeculativeGenerator`.

    from talon_sd import SpeculativeGenerator
    generator = SpeculativeGenerator()                       # packaged Qwen2.5-Coder 1.5B + 0.5B, TALON
    result = generator.generate("Write quicksort in Python.", max_new_tokens=128)
    print(result.text, result.stats.summary())
    for chunk in generator.stream([{"role": "user", "content": "Hi"}]):
        print(chunk, end="", flush=True)

Argument names follow Hugging Face ``generate`` where they overlap. With ``do_sample=False`` the
output is token for token the target's own greedy output; with sampling it follows the target's
distribution exactly (see :mod:`talon_sd.verify`). Bad arguments raise :class:`TalonError`
(a ``ValueError``) before any state changes; every call starts from fresh caches.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Sequence

import torch

from .builders import make_builder
from .config import GenerationConfig, SamplingConfig, TreeConfig
from .decoding import Pipeline, StopCondition, decode
from .drafters import DRAFTERS, ModelDrafter, NgramDrafter
from .errors import TalonError, bad_argument
from .lm import CausalLM
from .stats import DecodeStats

Prompt = str | Sequence[dict] | None


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]
    stats: DecodeStats
    finish_reason: str  # "stop" (EOS or a stop string) or "length"

    def to_dict(self) -> dict:
        return {"text": self.text, "token_ids": self.token_ids, "stats": self.stats.to_dict()}


@dataclass
class TextStream:
    """Iterates over text chunks as tokens are committed; ``result`` is set once it is exhausted."""

    chunks: Iterator[str]
    result: GenerationResult | None = field(default=None)

    def __iter__(self) -> Iterator[str]:
        return self.chunks


class SpeculativeGenerator:
    """Target + drafter + tree builder, ready to generate.

    target, draft  model names (built-in, local folder, .gguf file or hub id available offline)
    tree           a method name (``ar``, ``chain``, ``static``, ``eagle``, ``talon``) or a TreeConfig;
                   ``budget``, ``topk``, ``mu``, ``depth`` override its fields
    drafter        ``model`` (the draft LM) or ``ngram`` (prompt lookup, no draft model needed)
    dtype, device  ``auto`` picks bfloat16 where the hardware has it, CUDA when present
    chat_template  wrap string prompts in the tokenizer's chat template (instruct models)
    """

    def __init__(
        self,
        target: str | None = None,
        draft: str | None = None,
        *,
        tree: str | TreeConfig = "talon",
        drafter: str = "model",
        dtype: str = "auto",
        device: str | None = None,
        chat_template: bool = True,
        **tree_options,
    ) -> None:
        from . import models

        tree_config = _tree_config(tree, tree_options)
        _check_drafter(drafter)
        loaded_target = models.load_model(target or models.DEFAULT_TARGET, role="target", dtype=dtype, device=device)
        loaded_draft = None
        if drafter == "model" and tree_config.method != "ar":
            loaded_draft = models.load_model(
                draft or models.DEFAULT_DRAFT, role="draft", dtype=dtype, device=device, with_tokenizer=True
            )
            models.check_same_vocab(loaded_target, loaded_draft)
        self._setup(loaded_target.model, loaded_draft.model if loaded_draft else None, loaded_target.tokenizer,
                    tree_config, drafter, chat_template)

    @classmethod
    def from_models(
        cls,
        target_model,
        draft_model=None,
        tokenizer=None,
        *,
        tree: str | TreeConfig = "talon",
        drafter: str = "model",
        chat_template: bool = True,
        **tree_options,
    ) -> "SpeculativeGenerator":
        """Wrap Hugging Face models already in memory (they must share a vocabulary)."""
        self = cls.__new__(cls)
        tree_config = _tree_config(tree, tree_options)
        _check_drafter(drafter)
        if draft_model is not None:
            target_vocab = target_model.get_input_embeddings().weight.shape[0]
            draft_vocab = draft_model.get_input_embeddings().weight.shape[0]
            if target_vocab != draft_vocab:
                raise TalonError(
                    f"draft: vocabulary differs from the target's (target {target_vocab} tokens, draft {draft_vocab});"
                    " speculative decoding needs a draft that shares the target's tokenizer"
                )
        self._setup(target_model, draft_model, tokenizer, tree_config, drafter, chat_template)
        return self

    def _setup(self, target_model, draft_model, tokenizer, tree_config, drafter, chat_template) -> None:
        self.target_model, self.draft_model, self.tokenizer = target_model, draft_model, tokenizer
        self.tree_config, self.drafter_name, self.chat_template = tree_config, drafter, chat_template
        self.target = CausalLM(target_model)
        self.draft = CausalLM(draft_model) if draft_model is not None else None
        eos = set()
        for source in (getattr(tokenizer, "eos_token_id", None), getattr(target_model.generation_config, "eos_token_id", None)):
            eos.update([source] if isinstance(source, int) else (source or []))
        self.eos_token_ids = frozenset(eos)

    # ------------------------------------------------------------------ public calls
    def generate(self, prompt: Prompt = None, **options) -> GenerationResult:
        """Generate a completion. Options: ``input_ids``, ``max_new_tokens``, ``do_sample``, ``temperature``,
        ``top_p``, ``top_k``, ``seed``, ``stop``, ``ignore_eos``, ``tree`` (a TreeConfig or method name for this call)."""
        stream = self.stream(prompt, **options)
        for _ in stream:
            pass
        return stream.result

    def stream(self, prompt: Prompt = None, **options) -> TextStream:
        """Like :meth:`generate`, but returns a :class:`TextStream` of text chunks as tokens are committed.

        All arguments are validated here, before the first chunk is produced."""
        tokens, stats = self._tokens(prompt, options)
        stream = TextStream(chunks=iter(()))
        stream.chunks = self._chunks(tokens, stats, stream, options)
        return stream

    def token_stream(self, prompt: Prompt = None, **options) -> tuple[Iterator[int], DecodeStats]:
        """The raw token generator and its (live) stats."""
        tokens, stats = self._tokens(prompt, options)
        return tokens, stats

    # ------------------------------------------------------------------ internals
    def _tokens(self, prompt: Prompt, options: dict):
        options = dict(options)
        input_ids = options.pop("input_ids", None)
        tree = options.pop("tree", None)
        tree_config = self.tree_config if tree is None else _tree_config(tree, {})
        sampling_options, generation_options = {}, {}
        for key, value in options.items():
            if key in SamplingConfig.__dataclass_fields__:
                sampling_options[key] = value
            elif key in GenerationConfig.__dataclass_fields__:
                generation_options[key] = value
            else:
                raise TalonError(f"{key}: unknown option for generate()")
        sampling = SamplingConfig(**sampling_options)
        generation = GenerationConfig(**generation_options)
        prompt_ids = self._prompt_ids(prompt, input_ids)
        room = self.target.max_positions - prompt_ids.numel() - tree_config.budget
        if room < 1:
            raise bad_argument(
                "prompt", f"{prompt_ids.numel()} tokens", f"at most {self.target.max_positions - tree_config.budget - 1} "
                f"tokens (the target's context is {self.target.max_positions})"
            )
        drafter = self._drafter(tree_config)
        stop = StopCondition(
            max_new_tokens=min(generation.max_new_tokens, room),
            eos_token_ids=frozenset() if generation.ignore_eos else self.eos_token_ids,
            stop_strings=generation.stop,
            text_of=self._decode if generation.stop else None,
        )
        stats = DecodeStats(method=tree_config.label)
        pipeline = Pipeline(self.target, drafter, make_builder(tree_config), sampling)
        return decode(pipeline, prompt_ids, stop, stats), stats

    def _chunks(self, tokens: Iterator[int], stats: DecodeStats, stream: TextStream, options: dict) -> Iterator[str]:
        token_ids: list[int] = []
        emitted = ""
        for token in tokens:
            token_ids.append(token)
            text = self._decode(token_ids)
            if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for the next token
                continue
            if len(text) > len(emitted) and text.startswith(emitted):
                yield text[len(emitted):]
                emitted = text
        text = self._decode(token_ids)
        if len(text) > len(emitted) and text.startswith(emitted):
            yield text[len(emitted):]
        finish = "length"
        if token_ids and (token_ids[-1] in self.eos_token_ids or any(s in text for s in options.get("stop", ()) or ())):
            finish = "stop"
        stream.result = GenerationResult(text=text, token_ids=token_ids, stats=stats, finish_reason=finish)

    def _decode(self, token_ids: list[int]) -> str:
        if self.tokenizer is None:
            return " ".join(map(str, token_ids))
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def _prompt_ids(self, prompt: Prompt, input_ids) -> torch.Tensor:
        if input_ids is not None:
            ids = torch.as_tensor(input_ids, dtype=torch.long).flatten()
            if ids.numel() == 0:
                raise bad_argument("input_ids", [], "at least one token id")
            if int(ids.min()) < 0 or int(ids.max()) >= self.target.vocab_size:
                raise bad_argument("input_ids", "out-of-range ids", f"token ids in [0, {self.target.vocab_size})")
            return ids
        if self.tokenizer is None:
            raise TalonError("prompt: this generator has no tokenizer; pass input_ids")
        if isinstance(prompt, str):
            if not prompt.strip():
                raise bad_argument("prompt", prompt, "a non-empty string")
            messages = [{"role": "user", "content": prompt}] if self._use_chat_template() else None
        elif isinstance(prompt, (list, tuple)) and prompt and all(isinstance(m, dict) and "content" in m for m in prompt):
            messages = list(prompt)
        else:
            raise bad_argument("prompt", prompt, "a non-empty string or a list of {'role', 'content'} messages")
        if messages is None:
            ids = self.tokenizer(prompt, add_special_tokens=True)["input_ids"]
        else:
            if not getattr(self.tokenizer, "chat_template", None):
                raise TalonError("prompt: chat messages need a tokenizer with a chat template")
            ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            if hasattr(ids, "keys"):
                ids = ids["input_ids"]
        return torch.tensor(ids, dtype=torch.long).flatten()

    def _use_chat_template(self) -> bool:
        return self.chat_template and bool(getattr(self.tokenizer, "chat_template", None))

    def _drafter(self, tree_config: TreeConfig):
        if tree_config.method == "ar":
            return None
        if self.drafter_name == "ngram":
            return NgramDrafter(self.target.vocab_size)
        if self.draft is None:
            raise TalonError(f"draft: tree method {tree_config.method!r} needs a draft model (or drafter='ngram')")
        return ModelDrafter(self.draft)


def _tree_config(tree: str | TreeConfig, options: dict) -> TreeConfig:
    unknown = set(options) - set(TreeConfig.__dataclass_fields__)
    if unknown:
        raise TalonError(f"{sorted(unknown)[0]}: unknown option")
    options = {k: v for k, v in options.items() if v is not None}
    if isinstance(tree, TreeConfig):
        if not options:
            return tree
        base = {name: getattr(tree, name) for name in ("mu", "static_paths")}
        return TreeConfig(method=tree.method, **{**base, **options})
    if not isinstance(tree, str):
        raise bad_argument("tree", tree, "a method name or a TreeConfig")
    return TreeConfig(method=tree, **options)


def _check_drafter(drafter: str) -> None:
    if drafter not in DRAFTERS:
        raise bad_argument("drafter", drafter, "one of " + ", ".join(DRAFTERS))
