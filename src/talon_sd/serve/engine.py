"""The engines behind the server: a :class:`GenerationRequest` in, its text out.

:class:`BatchOneEngine` runs one request at a time (a :meth:`SpeculativeGenerator.stream` call);
:class:`BatchedEngine` runs up to ``max_batch`` requests together on one :class:`talon_sd.batch.BatchDecoder`
(one target forward verifies every request's tree each step; requests join and leave between steps). Both
only translate requests (prompt tokens, the context check, sampling options) and are called from the
scheduler's single worker thread, never from the event loop, so the generator, its tokenizer and torch
are only ever touched by one thread.

Context: a request is refused (:class:`ContextLengthError`, naming the argument) when its prompt
does not fit ``max_model_len`` or when ``prompt tokens + max_tokens`` exceeds it. With no
``max_tokens`` the completion may fill the rest of the context. The library may still stop earlier
(finish reason ``length``) when the context cannot hold one more draft tree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..batch import BatchDecoder
from ..config import SamplingConfig, TreeConfig
from ..decoding import Request
from ..errors import TalonError, bad_argument
from ..generator import GenerationResult, PreparedRequest, SpeculativeGenerator, TextAssembler, TextStream
from ..lm import CausalLM


class ContextLengthError(TalonError):
    """The prompt (``prompt: ...``) or prompt plus ``max_new_tokens`` does not fit the context."""


@dataclass(frozen=True)
class GenerationRequest:
    """One completion, in the engine's terms (cheap arguments already validated by the configs).

    prompt          chat messages (a tuple of ``{"role", "content"}`` dicts: the chat template is
                    applied), raw text (no template, the tokenizer's special tokens added) or a tuple
                    of token ids (used as they are)
    max_new_tokens  None: up to the end of the context
    sampling        greedy when ``sampling.do_sample`` is False
    stop            stop strings (the text ends before the first one)
    tree            the tree for this request; None: the server's
    ignore_eos      keep generating past EOS (fixed-length load tests)
    """

    prompt: tuple[dict, ...] | str | tuple[int, ...]
    max_new_tokens: int | None
    sampling: SamplingConfig
    stop: tuple[str, ...] = ()
    tree: TreeConfig | None = None
    ignore_eos: bool = False


@dataclass
class Generation:
    """A started generation: its prompt length and the library's text stream (``stream.result`` is
    set once the stream is exhausted; ``stream.close()`` stops it)."""

    prompt_tokens: int
    max_new_tokens: int
    stream: TextStream


class BatchOneEngine:
    """Runs requests one at a time on ``generator``; ``max_model_len`` (default: the target's context,
    never more) bounds prompt plus completion."""

    def __init__(self, generator: SpeculativeGenerator, max_model_len: int | None = None) -> None:
        model_len = generator.target.max_positions
        if max_model_len is not None and (isinstance(max_model_len, bool) or not isinstance(max_model_len, int)
                                          or not 2 <= max_model_len <= model_len):
            raise bad_argument("max_model_len", max_model_len, f"an integer in [2, {model_len}] (the target's context)")
        self.generator = generator
        self.max_model_len = max_model_len or model_len

    def start(self, request: GenerationRequest) -> Generation:
        """Tokenize, check the context, and open the stream (no forward runs until it is iterated).
        Raises :class:`TalonError` (a :class:`ContextLengthError` for the context) on a bad request."""
        prompt_ids, max_new_tokens = self._checked(request)
        stream = self.generator.stream(input_ids=prompt_ids, **_options(request, max_new_tokens))
        return Generation(prompt_tokens=len(prompt_ids), max_new_tokens=max_new_tokens, stream=stream)

    def _checked(self, request: GenerationRequest) -> tuple[list[int], int]:
        """The prompt's token ids and the completion's length, both checked against the context."""
        prompt_ids = self._prompt_ids(request.prompt)
        prompt_tokens = len(prompt_ids)
        room = self.max_model_len - prompt_tokens
        if room < 1:
            raise ContextLengthError(f"prompt: got {prompt_tokens} tokens, expected at most {self.max_model_len - 1} "
                                     f"(the context is {self.max_model_len} tokens)")
        max_new_tokens = request.max_new_tokens
        if max_new_tokens is None:
            max_new_tokens = room
        elif max_new_tokens > room:
            raise ContextLengthError(f"max_new_tokens: got {max_new_tokens}, expected at most {room} (the context is "
                                     f"{self.max_model_len} tokens and the prompt takes {prompt_tokens})")
        return prompt_ids, max_new_tokens

    def _prompt_ids(self, prompt: tuple[dict, ...] | str | Sequence[int]) -> list[int]:
        if isinstance(prompt, str):
            if not prompt.strip():
                raise bad_argument("prompt", prompt, "a non-empty string")
            return list(self.generator.tokenizer(prompt, add_special_tokens=True)["input_ids"])
        if prompt and all(isinstance(message, dict) for message in prompt):
            return self.generator.encode_prompt(list(prompt)).tolist()
        if prompt and all(isinstance(token, int) and not isinstance(token, bool) for token in prompt):
            vocab = self.generator.target.vocab_size
            if min(prompt) < 0 or max(prompt) >= vocab:
                raise bad_argument("prompt", "out-of-range token ids", f"token ids in [0, {vocab})")
            return list(prompt)
        raise bad_argument("prompt", prompt, "non-empty text, chat messages or token ids")


def _options(request: GenerationRequest, max_new_tokens: int) -> dict:
    sampling = request.sampling
    return dict(max_new_tokens=max_new_tokens, do_sample=sampling.do_sample, temperature=sampling.temperature,
                top_p=sampling.top_p, top_k=sampling.top_k, seed=sampling.seed, stop=request.stop,
                ignore_eos=request.ignore_eos, tree=request.tree)


@dataclass(eq=False)
class Running:
    """A request in the batch: its parts, the batch's handle on it, and its text so far."""

    prepared: PreparedRequest
    request: Request
    text: TextAssembler
    max_new_tokens: int

    @property
    def prompt_tokens(self) -> int:
        return int(self.prepared.prompt_ids.numel())


class BatchedEngine(BatchOneEngine):
    """Runs up to ``max_batch`` requests together (continuous batching): :meth:`join` prefills one request and
    adds it to the batch, :meth:`step` runs one verify step for all of them, :meth:`drop` takes one out. Requests
    with ``budget="auto"`` share one verify budget each step (:class:`talon_sd.batch.BatchDecoder`); each starts
    from what earlier requests of its kind learned, and gives its controller back when it ends."""

    def __init__(self, generator: SpeculativeGenerator, max_model_len: int | None = None, max_batch: int = 8) -> None:
        super().__init__(generator, max_model_len)
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise bad_argument("max_batch", max_batch, "an integer >= 1")
        self.max_batch = max_batch
        self.reset()  # the BatchDecoder raises for a target with sliding windows

    def join(self, request: GenerationRequest) -> Running:
        """Check ``request``, prefill it (the target's cache; a draft LM catches up at its first drafted step) and add
        it to the batch. Raises :class:`TalonError` on a bad request, before anything changes."""
        if len(self.running) >= self.max_batch:
            raise TalonError(f"max_batch: the batch already runs {self.max_batch} requests")
        prompt_ids, max_new_tokens = self._checked(request)
        prepared = self.generator.prepare(input_ids=prompt_ids, **_options(request, max_new_tokens))
        batched = self.decoder.add(prepared.pipeline, prepared.prompt_ids, prepared.stop, prepared.stats,
                                      prepared.alternate)
        running = Running(prepared, batched, self.generator.text_assembler(prepared.stop), max_new_tokens)
        self.running.append(running)
        return running

    def step(self) -> list[tuple[Running, str, GenerationResult | None]]:
        """One verify step for every running request: ``(request, new text, its result once it ended else None)``."""
        by_request = {id(running.request): running for running in self.running}
        updates = []
        for batched, tokens in self.decoder.step():
            running = by_request[id(batched)]
            text = "".join(running.text.push(token) for token in tokens)
            result = None
            if batched.stop.reason is not None:  # it left the batch
                rest, result = running.text.finish(running.prepared.stats)
                text += rest
                self.running.remove(running)
                self.generator.remember(running.prepared)
            updates.append((running, text, result))
        return updates

    def drop(self, running: Running) -> None:
        """Take ``running`` out of the batch (its client went away); what it learned is kept."""
        if running in self.running:
            self.running.remove(running)
            self.decoder.remove(running.request)
            self.generator.remember(running.prepared)

    def reset(self) -> None:
        """An empty batch (after an engine failure, the failed one's requests are dropped)."""
        self.running: list[Running] = []
        self.decoder = BatchDecoder(CausalLM(self.generator.target_model, role="target"))
