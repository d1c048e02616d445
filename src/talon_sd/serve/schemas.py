"""The OpenAI wire format: request bodies (pydantic), their translation into a
:class:`~talon_sd.serve.engine.GenerationRequest`, the error object, and the response shapes.

Requests are validated in two layers: pydantic checks types (strict: ``"0.5"`` is not a number,
``NaN`` and infinities are refused), the library's frozen configs check ranges and raise
:class:`~talon_sd.TalonError` messages that start with the argument's name; both become an OpenAI
error object with status 400 and ``param`` set.

Defaults follow OpenAI: ``temperature`` 1 (sampling; send 0 for greedy), ``top_p`` 1, ``n`` 1 (the
only value served), no ``max_tokens`` = up to the end of the context.

The ``talon`` field of a response (and of the last streamed chunk) holds the speculative statistics
of that request: ``mean_accepted_tokens`` (MAT: tokens committed per verify step, the bonus token
included, so plain decoding has MAT 1), ``draft_forwards_per_verify`` (delta),
``acceptance_per_depth`` (share of steps whose tree reached depth d that accepted a token there),
``tokens_per_second``, ``verify_steps`` (target forwards), ``accepted_length_hist``, the draft and
verify seconds, ``method`` (the tree) and ``stop_reason`` (eos, stop_string, max_new_tokens, context).
"""

from __future__ import annotations

import time
import uuid
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict

from ..config import AUTO, AUTO_METHODS, GenerationConfig, SamplingConfig, TreeConfig
from ..errors import TalonError, bad_argument
from ..generator import GenerationResult
from .engine import ContextLengthError, GenerationRequest

DEFAULT_TEMPERATURE = 1.0  # OpenAI's default: sampling. Greedy is temperature 0.


class OpenAIError(Exception):
    """An error answered as ``{"error": {"message", "type", "param", "code"}}`` with ``status``."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


# library argument names -> request field names, for errors
_PARAM_NAMES = {"max_new_tokens": "max_tokens", "tree": "talon.tree", "budget": "talon.budget", "topk": "talon.topk",
                "mu": "talon.mu", "depth": "talon.depth", "draft": "talon.tree", "static_paths": "talon.tree"}


def error_from_talon(error: TalonError, prompt_field: str, max_tokens_field: str = "max_tokens") -> OpenAIError:
    """A :class:`TalonError` (``"name: ..."``) as a 400 naming the request field it came from."""
    name, separator, rest = str(error).partition(":")
    name = name.strip()
    if not separator or not name.isidentifier():
        return OpenAIError(400, str(error))
    names = {**_PARAM_NAMES, "prompt": prompt_field, "input_ids": prompt_field, "max_new_tokens": max_tokens_field}
    param = names.get(name, name)
    code = "context_length_exceeded" if isinstance(error, ContextLengthError) else None
    return OpenAIError(400, f"{param}:{rest}", param=param, code=code)


# ---------------------------------------------------------------------------------------------- requests
class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="ignore")


class TalonOptions(_Strict):
    """talon-sd's extras; unset fields keep the server's tree (a new ``tree`` with no budget takes 'auto'
    where the method has it)."""

    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="forbid")
    tree: str | None = None
    budget: int | Literal["auto"] | None = None
    topk: int | None = None
    mu: float | None = None
    depth: int | None = None
    ignore_eos: bool = False  # generate past EOS (fixed-length load tests)


class StreamOptions(_Strict):
    include_usage: bool = False


class _CompletionFields(_Strict):
    """Fields shared by chat and text completions."""

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    talon: TalonOptions | None = None
    # accepted only at their neutral values (talon-sd does not implement them)
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict | None = None
    logprobs: bool | int | None = None
    top_logprobs: int | None = None
    best_of: int | None = None
    echo: bool | None = None
    tools: list | None = None
    suffix: str | None = None

    prompt_field: ClassVar[str] = "prompt"

    def generation_request(self, prompt, server_tree: TreeConfig) -> GenerationRequest:
        """This body as an engine request; raises :class:`OpenAIError` (400) on a bad or unsupported field."""
        self._refuse_unsupported()
        max_tokens_field, max_tokens = self._max_tokens()
        if max_tokens is not None and max_tokens < 1:
            raise OpenAIError(400, f"{max_tokens_field}: got {max_tokens}, expected an integer >= 1",
                              param=max_tokens_field)
        temperature = DEFAULT_TEMPERATURE if self.temperature is None else self.temperature
        try:
            sampling = SamplingConfig(do_sample=temperature > 0, temperature=temperature,
                                      top_p=1.0 if self.top_p is None else self.top_p, seed=self.seed)
            stop = GenerationConfig(max_new_tokens=max_tokens or 1, stop=() if self.stop is None else self.stop).stop
            tree = _tree_config(self.talon, server_tree)
        except TalonError as error:
            raise error_from_talon(error, self.prompt_field, max_tokens_field) from None
        return GenerationRequest(prompt=prompt, max_new_tokens=max_tokens, sampling=sampling, stop=stop, tree=tree,
                                 ignore_eos=bool(self.talon and self.talon.ignore_eos))

    @property
    def max_tokens_field(self) -> str:
        """The field that sets this request's completion length (for error messages)."""
        return self._max_tokens()[0]

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    def _max_tokens(self) -> tuple[str, int | None]:
        """(the field that sets the completion length, its value)."""
        return "max_tokens", self.max_tokens

    def _refuse_unsupported(self) -> None:
        if self.n is not None and self.n != 1:
            raise OpenAIError(400, f"n: got {self.n}, expected 1 (talon serves one choice per request)", param="n")
        neutral = {"presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0), "logit_bias": (None, {}),
                   "logprobs": (None, False, 0), "top_logprobs": (None, 0), "best_of": (None, 1), "echo": (None, False),
                   "tools": (None, []), "suffix": (None, "")}
        for name, allowed in neutral.items():
            value = getattr(self, name)
            if value not in allowed:
                raise OpenAIError(400, f"{name}: not supported by talon-sd (got {value!r})", param=name)


class TextPart(_Strict):
    model_config = ConfigDict(strict=True, extra="allow")
    type: str
    text: str | None = None


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None

    def text(self, index: int) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        for part in self.content:
            if part.type != "text" or part.text is None:
                raise OpenAIError(400, f"messages[{index}].content: only text parts are supported (got {part.type!r})",
                                  param=f"messages[{index}].content")
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(_CompletionFields):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    prompt_field: ClassVar[str] = "messages"

    def engine_request(self, server_tree: TreeConfig) -> GenerationRequest:
        if not self.messages:
            raise OpenAIError(400, "messages: got [], expected at least one message", param="messages")
        messages = tuple({"role": message.role, "content": message.text(index)}
                         for index, message in enumerate(self.messages))
        return self.generation_request(messages, server_tree)

    def _max_tokens(self) -> tuple[str, int | None]:
        """``max_completion_tokens`` (OpenAI's current name) when set, else ``max_tokens``."""
        if self.max_completion_tokens is None:
            return super()._max_tokens()
        return "max_completion_tokens", self.max_completion_tokens


class CompletionRequest(_CompletionFields):
    """``prompt``: text (sent as it is, no chat template), one text in a list, or a list of token ids."""

    prompt: str | list[str] | list[int]

    def engine_request(self, server_tree: TreeConfig) -> GenerationRequest:
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and all(isinstance(item, str) for item in prompt):
            if len(prompt) != 1:
                raise OpenAIError(400, f"prompt: got {len(prompt)} prompts, expected one (n = 1, no batching)",
                                  param="prompt")
            prompt = prompt[0]
        if isinstance(prompt, str) and not prompt.strip():
            raise OpenAIError(400, "prompt: got an empty string, expected text", param="prompt")
        if isinstance(prompt, list):
            if not prompt:
                raise OpenAIError(400, "prompt: got [], expected text or token ids", param="prompt")
            prompt = tuple(prompt)
        return self.generation_request(prompt, server_tree)


def _tree_config(options: TalonOptions | None, server_tree: TreeConfig) -> TreeConfig | None:
    """The request's tree: None (the server's), the server's with options replaced, or a new method
    (a method name with no budget takes 'auto' for talon/eagle/chain, as in the library)."""
    if options is None:
        return None
    fields = {name: getattr(options, name) for name in ("budget", "topk", "mu", "depth")}
    fields = {name: value for name, value in fields.items() if value is not None}
    if options.tree is None:
        return server_tree.with_options(**fields) if fields else None
    if not isinstance(options.tree, str) or not options.tree:
        raise bad_argument("tree", options.tree, "a tree method name")
    if options.tree in AUTO_METHODS and "budget" not in fields and not (options.tree == "chain" and "depth" in fields):
        fields["budget"] = AUTO
    return TreeConfig(method=options.tree, **fields)


# ---------------------------------------------------------------------------------------------- responses
def talon_stats(result: GenerationResult) -> dict:
    """The speculative statistics of one request (see the module docstring)."""
    stats = result.stats.to_dict()
    return {
        "method": stats["method"],
        "mean_accepted_tokens": stats["mat"],
        "bonus_token_counted": True,
        "draft_forwards_per_verify": stats["delta"],
        "acceptance_per_depth": stats["depth_acceptance"],
        "accepted_length_hist": stats["accepted_length_hist"],
        "tokens_per_second": stats["tokens_per_s"],
        "verify_steps": stats["target_forwards"],
        "seconds_draft": stats["seconds_draft"],
        "seconds_verify": stats["seconds_verify"],
        "stop_reason": result.stop_reason,
        "seed": stats["seed"],  # the sampling seed (drawn when the request gave none); None when greedy
    }


def usage(result: GenerationResult, prompt_tokens: int) -> dict:
    completion_tokens = len(result.token_ids)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


class _Responder:
    """One request's id, creation time and model name, shared by its response or stream events."""

    id_prefix = ""

    def __init__(self, model: str, include_usage: bool = False) -> None:
        self.model, self.include_usage = model, include_usage
        self.id, self.created = f"{self.id_prefix}-{uuid.uuid4().hex}", int(time.time())

    def _head(self, object_name: str) -> dict:
        return {"id": self.id, "object": object_name, "created": self.created, "model": self.model}

    def _with_usage_field(self, chunk: dict) -> dict:
        """With ``include_usage`` every chunk carries ``usage: null`` and a last chunk the counts."""
        return {**chunk, "usage": None} if self.include_usage else chunk

    def _closing(self, last: dict, result: GenerationResult, prompt_tokens: int, object_name: str) -> list[dict]:
        last = {**last, "talon": talon_stats(result)}
        if not self.include_usage:
            return [last]
        return [last, {**self._head(object_name), "choices": [], "usage": usage(result, prompt_tokens)}]


class ChatResponder(_Responder):
    """``chat.completion`` responses and ``chat.completion.chunk`` stream events."""

    id_prefix = "chatcmpl"

    def response(self, result: GenerationResult, prompt_tokens: int) -> dict:
        choice = {"index": 0, "message": {"role": "assistant", "content": result.text},
                  "finish_reason": result.finish_reason, "logprobs": None}
        return {**self._head("chat.completion"), "choices": [choice], "usage": usage(result, prompt_tokens),
                "talon": talon_stats(result)}

    def opening(self) -> list[dict]:
        """Sent once the request leaves the queue: the assistant role."""
        return [self._chunk({"role": "assistant", "content": ""})]

    def chunk(self, text: str) -> dict:
        return self._chunk({"content": text})

    def closing(self, result: GenerationResult, prompt_tokens: int) -> list[dict]:
        """The finish reason with the talon stats, then (include_usage) the usage chunk."""
        return self._closing(self._chunk({}, result.finish_reason), result, prompt_tokens, "chat.completion.chunk")

    def _chunk(self, delta: dict, finish_reason: str | None = None) -> dict:
        return self._with_usage_field({**self._head("chat.completion.chunk"), "choices": [
            {"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}]})


class CompletionResponder(_Responder):
    """``text_completion`` responses and stream events (one object name for both)."""

    id_prefix = "cmpl"

    def response(self, result: GenerationResult, prompt_tokens: int) -> dict:
        choice = {"index": 0, "text": result.text, "finish_reason": result.finish_reason, "logprobs": None}
        return {**self._head("text_completion"), "choices": [choice], "usage": usage(result, prompt_tokens),
                "talon": talon_stats(result)}

    def opening(self) -> list[dict]:
        return []

    def chunk(self, text: str) -> dict:
        return self._chunk(text)

    def closing(self, result: GenerationResult, prompt_tokens: int) -> list[dict]:
        return self._closing(self._chunk("", result.finish_reason), result, prompt_tokens, "text_completion")

    def _chunk(self, text: str, finish_reason: str | None = None) -> dict:
        return self._with_usage_field({**self._head("text_completion"), "choices": [
            {"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": None}]})
