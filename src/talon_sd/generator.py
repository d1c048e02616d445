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
(a ``ValueError``) before any state changes.

Isolation: every ``generate``/``stream`` call owns its decoding state (its own KV caches over the
shared weights, its own drafter and budget controller), so streams can be interleaved or run from
several threads without seeing each other's caches. With ``budget="auto"`` each call starts from a copy
of the controller the last finished call of the same method, drafter and sampling mode ended with
(this machine's costs, the acceptance seen, the budget chosen): see
:meth:`talon_sd.control.BudgetController.for_next_sequence`.

Stop strings follow the OpenAI API: the text ends before the first stop string (the token ids
include the token that completed it), and a stream never yields text that a stop string later cuts.
"""

from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator, Sequence

import torch

from .builders import make_builder
from .config import AUTO, AUTO_METHODS, CPU_KERNELS, QUANTIZE, GenerationConfig, SamplingConfig, TreeConfig
from .decoding import Pipeline, StopCondition, decode
from .drafters import DRAFTERS, Eagle3Drafter, ModelDrafter, NgramDrafter
from .errors import TalonError, TalonWarning, bad_argument
from .lm import CausalLM, apply_cpu_kernels, apply_draft_quantization, draft_int8_possible, kernels_of
from .stats import DecodeStats

if TYPE_CHECKING:
    from .control import BudgetController, CostPrior

Prompt = str | Sequence[dict] | None
MAX_AUTO_BUDGET = 64  # the largest tree the online controller may choose


@dataclass
class GenerationResult:
    text: str  # the decoded completion, cut before the first stop string
    token_ids: list[int]
    stats: DecodeStats
    finish_reason: str  # "stop" (EOS or a stop string) or "length" (max_new_tokens or the context)
    stop_reason: str = "max_new_tokens"  # eos, stop_string, max_new_tokens or context
    stop_string: str | None = None  # the stop string that ended the generation

    def to_dict(self) -> dict:
        return {"text": self.text, "token_ids": self.token_ids, "finish_reason": self.finish_reason,
                "stop_reason": self.stop_reason, "stats": self.stats.to_dict()}


@dataclass(frozen=True)
class PreparedRequest:
    """One checked call (:meth:`SpeculativeGenerator.prepare`): what :func:`talon_sd.decoding.decode` or a
    :class:`talon_sd.batch.BatchDecoder` runs, and the key its controller is remembered under."""

    pipeline: Pipeline
    prompt_ids: torch.Tensor  # [L]
    stop: StopCondition
    stats: DecodeStats
    key: tuple[str, str, bool]  # (method, drafter, sampled)
    alternate: Pipeline | None = None  # with a draft LM and an online budget: the n-gram drafter's, for batches


class TextAssembler:
    """One request's text as its tokens come, detokenized incrementally: each token's text is the decode of a few
    tokens before it and itself, less the decode of those few (so a token's leading space is right), held back
    while it ends in an incomplete UTF-8 sequence or may begin a stop string. The result's text is one decode of
    all the tokens. ``push`` returns the new text safe to show ('' if none); ``finish`` the rest and the result."""

    def __init__(self, decode, stop: StopCondition, result) -> None:
        self._decode, self._stop, self._result = decode, stop, result
        self.token_ids: list[int] = []
        self._text = self._emitted = ""  # the text so far, and what of it was returned
        self._prefix = self._read = 0  # token_ids[prefix:read] are the context whose text is already in _text

    def push(self, token: int) -> str:
        token_ids = self.token_ids
        token_ids.append(token)
        known, grown = self._decode(token_ids[self._prefix:self._read]), self._decode(token_ids[self._prefix:])
        if grown.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for the next token
            return ""
        if grown.startswith(known):
            self._text += grown[len(known):]
        else:  # the tokenizer rewrote the context's text (e.g. spaces cleaned up): decode it all once
            self._text = self._decode(token_ids)
        self._prefix, self._read = max(self._read - 4, 0), len(token_ids)
        stop_strings = self._stop.stop_strings
        cut = _cut_at_stop(self._text, stop_strings)
        safe = len(cut) - _stop_prefix_length(cut, stop_strings)  # hold back a possible stop string
        if safe > len(self._emitted) and cut.startswith(self._emitted):
            new, self._emitted = cut[len(self._emitted):safe], cut[:safe]
            return new
        return ""

    def finish(self, stats: DecodeStats) -> "tuple[str, GenerationResult]":
        result = self._result(self.token_ids, stats, self._stop)
        rest = result.text[len(self._emitted):] if result.text.startswith(self._emitted) else ""
        return rest, result


@dataclass
class TextStream:
    """Iterates over text chunks as tokens are committed; ``result`` is set once it is exhausted."""

    chunks: Iterator[str]
    result: GenerationResult | None = field(default=None)

    def __iter__(self) -> Iterator[str]:
        return self.chunks

    def close(self) -> None:
        """Stop generating (e.g. the client went away); ``result`` stays None."""
        close = getattr(self.chunks, "close", None)
        if close is not None:
            close()


class SpeculativeGenerator:
    """Target + drafter + tree builder, ready to generate.

    target, draft  model names (built-in, local folder, .gguf file or hub id available offline)
    tree           a method name (``ar``, ``chain``, ``static``, ``eagle``, ``talon``) or a TreeConfig;
                   ``budget``, ``topk``, ``mu``, ``depth`` override its fields. With a method name
                   and no budget, talon/eagle/chain take ``budget="auto"``: the online controller
                   picks each step's budget for this machine and prompt (:mod:`talon_sd.control`)
    drafter        ``model`` (the draft LM), ``ngram`` (prompt lookup, no draft model needed) or ``eagle3``
                   (``draft`` names an EAGLE-3 head folder: SafeAILab/SpecForge/vLLM format, or ours)
    dtype, device  ``auto`` picks bfloat16 where the hardware has it (float32 for ``quantize="int4"`` where
                   :mod:`talon_sd.kernels` run: :func:`talon_sd.models.resolve_dtype`), CUDA when present
    chat_template  wrap string prompts in the tokenizer's chat template (instruct models)
    head           an EAGLE-3 head folder loaded beside the draft LM, for calls with ``drafter="eagle3"``
    initial_budget the controller's first budget (e.g. from a ``talon tune`` profile)
    cpu_kernels    float32 linears on CPU: ``packed`` for oneDNN, ``default`` torch's own, ``auto`` whichever
                   serves one row faster on this CPU (or packed when nearly as fast on one row and far faster
                   on four), measured per model at load
                   (:func:`talon_sd.lm.choose_cpu_kernels`); ``self.cpu_kernels`` says what each model runs
    quantize       CPU linears of the target and the draft LM: ``int4`` (groups of 32; a GGUF's Q4_K tensors as
                   stored) or ``int8`` weight-only (:mod:`talon_sd.quantize`; the output is then the quantized
                   target's), ``none`` (as loaded, ``cpu_kernels`` applies), ``auto``: the target as loaded and
                   the draft LM's linears dynamically quantized to int8 where one int8 row is faster on
                   this CPU than in the run's dtype (float32, or bfloat16 in a bfloat16 run;
                   :func:`talon_sd.lm.choose_draft_quantization`; the output is the target's either way).
                   ``self.cpu_kernels`` says what each model runs
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
        initial_budget: int | None = None,
        cost_prior: "CostPrior | None" = None,
        cpu_kernels: str = "auto",
        quantize: str = "auto",
        head: str | None = None,
        **tree_options,
    ) -> None:
        from . import models

        tree_config = _tree_config(tree, tree_options)
        _check_drafter(drafter)
        if cpu_kernels not in CPU_KERNELS:
            raise bad_argument("cpu_kernels", cpu_kernels, "'auto' (measured: packed where it is faster), "
                               "'packed' (oneDNN-packed float32 linears on CPU) or 'default'")
        if quantize not in QUANTIZE:
            raise bad_argument("quantize", quantize, "'auto' (an int8 draft LM where measured faster), 'none', "
                               "'int8' or 'int4' (weight-only CPU linears of target and draft LM)")
        weights = quantize if quantize in ("int4", "int8") else "none"
        loaded_target = models.load_model(target or models.DEFAULT_TARGET, role="target", dtype=dtype, device=device,
                                          quantize=weights)
        target_gguf = models.gguf_of(loaded_target.source)
        apply_cpu_kernels(loaded_target.model, cpu_kernels)
        loaded_draft = None
        if drafter == "eagle3" and tree_config.method != "ar":
            from .eagle3 import load_eagle3_head

            if not draft:
                raise TalonError("draft: drafter 'eagle3' needs --draft / draft= naming an EAGLE-3 head folder")
            head = load_eagle3_head(draft, loaded_target.model)
            self._setup(loaded_target.model, head, loaded_target.tokenizer, tree_config, drafter, chat_template)
            self._controller_start(initial_budget, cost_prior)
            self.target_gguf = target_gguf
            return
        if drafter == "model" and tree_config.method != "ar":
            target_dtype = next(loaded_target.model.parameters()).dtype
            dynamic_int8 = draft_int8_possible(quantize, loaded_target.model.device)
            loaded_draft = models.load_model(  # float32 where its linears may go int8 (they take float32 rows)
                draft or models.DEFAULT_DRAFT, role="draft", dtype="float32" if dynamic_int8 else dtype,
                device=device, with_tokenizer=True, quantize=weights,
            )
            models.check_same_vocab(loaded_target, loaded_draft)
            apply_draft_quantization(loaded_draft.model, "auto" if dynamic_int8 else "none", cpu_kernels,
                                     dtype=target_dtype if dynamic_int8 else None)
        extra_head = None
        if head is not None:  # an EAGLE-3 head beside the draft LM: per-call drafter="eagle3"
            from .eagle3 import load_eagle3_head

            extra_head = load_eagle3_head(head, loaded_target.model)
        self._setup(loaded_target.model, loaded_draft.model if loaded_draft else None, loaded_target.tokenizer,
                    tree_config, drafter, chat_template)
        if extra_head is not None:
            self.head = extra_head
        self._controller_start(initial_budget, cost_prior)
        self.target_gguf = target_gguf

    @classmethod
    def from_models(
        cls,
        target_model,
        draft_model=None,
        tokenizer=None,
        *,
        draft_tokenizer=None,
        tree: str | TreeConfig = "talon",
        drafter: str = "model",
        chat_template: bool = True,
        initial_budget: int | None = None,
        cost_prior: "CostPrior | None" = None,
        **tree_options,
    ) -> "SpeculativeGenerator":
        """Wrap Hugging Face models already in memory (``drafter="eagle3"``: ``draft_model`` is an
        :class:`~talon_sd.eagle3.Eagle3Head` for this target).

        The draft must mean the same token ids as the target: when both ``tokenizer`` and
        ``draft_tokenizer`` are given their vocabularies must be equal; either way the draft's
        distributions are cut (or padded) to the target's vocabulary, so no draft id outside it
        ever reaches a tree."""
        from .models import check_vocabularies

        self = cls.__new__(cls)
        tree_config = _tree_config(tree, tree_options)
        _check_drafter(drafter)
        if draft_model is not None and tokenizer is not None and draft_tokenizer is not None:
            check_vocabularies(tokenizer, draft_tokenizer)
        self._setup(target_model, draft_model, tokenizer, tree_config, drafter, chat_template)
        self._controller_start(initial_budget, cost_prior)
        return self

    def _setup(self, target_model, draft_model, tokenizer, tree_config, drafter, chat_template) -> None:
        self.target_model, self.tokenizer = target_model, tokenizer
        self.target_gguf: str | None = None  # the GGUF file the target was loaded from, where it was one
        self.tree_config, self.drafter_name, self.chat_template = tree_config, drafter, chat_template
        # Models that do not fit tree verification are refused here, before any generation.
        self.target = CausalLM(target_model, role="target")  # limits and layout; each call makes its own cache
        self.head = draft_model if drafter == "eagle3" else None  # an EAGLE-3 head over the target's states
        if drafter == "eagle3" and draft_model is not None:
            from .eagle3 import Eagle3Head

            if not isinstance(draft_model, Eagle3Head):
                raise bad_argument("draft_model", type(draft_model).__name__, "an Eagle3Head with drafter='eagle3'")
            draft_model = None
        self.draft_model = draft_model
        self.draft = CausalLM(draft_model, role="draft") if draft_model is not None else None
        # what the linears run with, read off the models: "packed" (oneDNN) or "default"
        self.cpu_kernels = {"target": kernels_of(target_model), "draft": kernels_of(draft_model)}
        eos = set()
        for source in (getattr(tokenizer, "eos_token_id", None), getattr(target_model.generation_config, "eos_token_id", None)):
            eos.update([source] if isinstance(source, int) else (source or []))
        self.eos_token_ids = frozenset(eos)

    def _controller_start(self, initial_budget: int | None, cost_prior: "CostPrior | None") -> None:
        if initial_budget is not None and (isinstance(initial_budget, bool) or not isinstance(initial_budget, int)
                                           or not 1 <= initial_budget <= MAX_AUTO_BUDGET):
            raise bad_argument("initial_budget", initial_budget, f"an integer in [1, {MAX_AUTO_BUDGET}]")
        self.initial_budget = initial_budget
        self.cost_prior = cost_prior  # the first controller's costs (e.g. a ``talon tune`` profile); then measured
        # (method, drafter, sampled) -> the last auto-budget generation's controller: the next call's start
        self._learned: dict[tuple[str, str, bool], "BudgetController"] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ public calls
    def generate(self, prompt: Prompt = None, **options) -> GenerationResult:
        """Generate a completion. Options: ``input_ids``, ``max_new_tokens``, ``do_sample``, ``temperature``,
        ``top_p``, ``top_k``, ``seed``, ``stop``, ``ignore_eos``, ``tree`` (a TreeConfig or method name for this
        call), ``drafter`` (``model``, ``ngram`` or ``eagle3`` for this call, if the generator holds what it needs)."""
        stream = self.stream(prompt, **options)
        for _ in stream:
            pass
        return stream.result

    def generate_batch(self, prompts: Sequence[Prompt | Sequence[int]], **options) -> list[GenerationResult]:
        """Generate a completion for each prompt, together: every step one target forward verifies all the requests'
        trees (:mod:`talon_sd.batch`), each request with its own drafter, budget and sampling. A prompt is what
        :meth:`generate` takes, or a list of token ids. Options as for :meth:`generate`; a list (``stop`` excepted)
        gives one value per prompt, e.g. ``max_new_tokens=[64, 16]`` or ``seed=[1, 2]``. Each result is the one
        :meth:`generate` gives for its prompt alone (up to floating-point near-ties, as for trees). With
        ``budget="auto"`` the requests start from what earlier calls learned and the batch shares one verify budget
        among them (drafting with the draft LMs, or with n-gram drafters where those measured faster); what the batch measures is not carried to later calls (its costs are a batch's, not a request's)."""
        from .batch import decode_batch

        if not isinstance(prompts, (list, tuple)) or not prompts:
            raise bad_argument("prompts", prompts, "a non-empty list of prompts")
        for key, value in options.items():
            if isinstance(value, list) and key != "stop" and len(value) != len(prompts):
                raise bad_argument(key, value, f"one value, or a list of {len(prompts)} (one per prompt)")
        requests = []
        for i, prompt in enumerate(prompts):
            mine = {k: v[i] if isinstance(v, list) and k != "stop" else v for k, v in options.items()}
            if isinstance(prompt, (list, tuple)) and prompt and all(isinstance(t, int) for t in prompt):
                prompt, mine["input_ids"] = None, prompt
            requests.append(self.prepare(prompt, **mine))  # every request checked before any decoding
        token_ids: list[list[int]] = [[] for _ in requests]
        parts = [(r.pipeline, r.prompt_ids, r.stop, r.stats, r.alternate) for r in requests]
        for index, token in decode_batch(CausalLM(self.target_model, role="target"), parts):
            token_ids[index].append(token)
        return [self._result(ids, r.stats, r.stop) for ids, r in zip(token_ids, requests)]

    def stream(self, prompt: Prompt = None, **options) -> TextStream:
        """Like :meth:`generate`, but returns a :class:`TextStream` of text chunks as tokens are committed.

        All arguments are validated here, before the first chunk is produced."""
        tokens, stats, stop = self._tokens(prompt, options)
        stream = TextStream(chunks=iter(()))
        stream.chunks = self._chunks(tokens, stats, stream, stop)
        return stream

    def token_stream(self, prompt: Prompt = None, **options) -> tuple[Iterator[int], DecodeStats]:
        """The raw token generator and its (live) stats."""
        tokens, stats, _ = self._tokens(prompt, options)
        return tokens, stats

    def encode_prompt(self, prompt: Prompt = None, input_ids=None) -> torch.Tensor:
        """The prompt's token ids [L] as :meth:`generate` sees them (chat template applied when enabled)."""
        return self._prompt_ids(prompt, input_ids)

    def prepare(self, prompt: Prompt = None, **options) -> "PreparedRequest":
        """One call's parts, every argument checked as :meth:`generate` checks them, nothing run yet: what a caller
        that drives :class:`talon_sd.batch.BatchDecoder` itself (the server) needs. Give the controller back with
        :meth:`remember` when the request ends, as :meth:`generate` does."""
        options = dict(options)
        input_ids = options.pop("input_ids", None)
        tree = options.pop("tree", None)
        drafter_name = options.pop("drafter", self.drafter_name)
        _check_drafter(drafter_name)
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
        stop = self._stop_condition(prompt_ids, tree_config, generation)
        drafter = self._drafter(tree_config, drafter_name)
        target = CausalLM(self.target_model, role="target")
        controller = self._controller(tree_config, sampling, drafter_name)
        stats = DecodeStats(method=tree_config.label)
        pipeline = Pipeline(target, drafter, make_builder(tree_config), sampling, controller)
        alternate = None
        if controller is not None and isinstance(drafter, ModelDrafter):  # a batch may find the n-gram drafter cheaper
            alternate = Pipeline(target, NgramDrafter(self.target.vocab_size), make_builder(tree_config), sampling,
                                 self._controller(tree_config, sampling, NgramDrafter.name))
        return PreparedRequest(pipeline, prompt_ids, stop, stats, (tree_config.method, drafter_name, not sampling.greedy),
                               alternate)

    def remember(self, request: "PreparedRequest") -> None:
        """Start the next auto-budget calls of ``request``'s kind (and of its n-gram alternate's, where a batch ran
        it) from what their controllers learned."""
        method, drafter_name, sampled = request.key
        for pipeline in [request.pipeline] + ([request.alternate] if request.alternate is not None else []):
            controller = pipeline.controller
            if controller is not None and controller.verify.samples:
                with self._lock:
                    name = pipeline.drafter.name if pipeline.drafter is not None else drafter_name
                    self._learned[(method, name, sampled)] = controller

    # ------------------------------------------------------------------ internals
    def _tokens(self, prompt: Prompt, options: dict):
        request = self.prepare(prompt, **options)
        tokens = decode(request.pipeline, request.prompt_ids, request.stop, request.stats)
        return self._remember_controller(tokens, request), request.stats, request.stop

    def _stop_condition(self, prompt_ids: torch.Tensor, tree_config: TreeConfig, generation: GenerationConfig):
        """Checks the prompt against the target's and the draft's contexts; lowers max_new_tokens (with a
        warning) when the context cannot hold that many tokens plus one tree."""
        context = self.target.max_positions
        uses_draft = self.draft is not None and tree_config.method != "ar" and self.drafter_name == "model"
        if uses_draft and self.draft.max_positions < context:
            context = self.draft.max_positions
        largest_tree = MAX_AUTO_BUDGET if tree_config.auto else tree_config.budget
        room = context - prompt_ids.numel() - largest_tree
        owner = "the draft's" if uses_draft and context < self.target.max_positions else "the target's"
        if room < 1:
            raise bad_argument("prompt", f"{prompt_ids.numel()} tokens", f"at most {context - largest_tree - 1} tokens "
                               f"({owner} context is {context} and a tree takes up to {largest_tree})")
        max_new_tokens, reason = generation.max_new_tokens, "max_new_tokens"
        if room < max_new_tokens:
            warnings.warn(f"max_new_tokens: lowered from {max_new_tokens} to {room} to fit {owner} context of {context} "
                          f"tokens", TalonWarning, stacklevel=4)
            max_new_tokens, reason = room, "context"
        return StopCondition(
            max_new_tokens=max_new_tokens,
            eos_token_ids=frozenset() if generation.ignore_eos else self.eos_token_ids,
            stop_strings=generation.stop,
            text_of=self._decode if generation.stop else None,
            length_reason=reason,
        )

    def _controller(self, tree_config: TreeConfig, sampling: SamplingConfig, drafter: str) -> "BudgetController | None":
        """A controller for one auto-budget call: the previous call's with the same method, drafter and
        sampling mode, carried over (:meth:`BudgetController.for_next_sequence`), else a new one seeded
        with ``initial_budget`` and the costs last measured with this drafter (or ``cost_prior``)."""
        if not tree_config.auto:
            return None
        from .control import BudgetController, ControllerSettings, CostPrior

        key = (tree_config.method, drafter, not sampling.greedy)
        with self._lock:
            learned = self._learned.get(key)
            if learned is not None:
                return learned.for_next_sequence()
            same_drafter = [c for (_, name, _), c in self._learned.items() if name == drafter]
            prior = CostPrior(same_drafter[-1].verify.medians(), same_drafter[-1].draft.medians()) if same_drafter \
                else self.cost_prior
        initial = self.initial_budget or _initial_budget(tree_config.method)
        settings = ControllerSettings(max_budget=MAX_AUTO_BUDGET if tree_config.method != "chain" else 17,
                                      initial_budget=min(initial, 17) if tree_config.method == "chain" else initial,
                                      kind_floor=1.0 if DRAFTERS[drafter].follows_confidence else 0.0)
        return BudgetController(settings, prior)

    def _remember_controller(self, tokens: Iterator[int], request: "PreparedRequest") -> Iterator[int]:
        """Pass ``tokens`` through; afterwards keep the request's controller (:meth:`remember`: its costs, acceptance
        samples and choice) to start the next call of its kind: this machine's costs do not change between
        prompts, and requests are often too short for a fresh controller to settle."""
        try:
            yield from tokens
        finally:
            self.remember(request)

    def controller_memory(self) -> dict:
        """A snapshot of what the next auto-budget calls start from (one carried controller per method,
        drafter and sampling mode). Controllers are never changed once remembered (each call runs a copy,
        :meth:`BudgetController.for_next_sequence`), so the snapshot stays valid whatever runs next."""
        with self._lock:
            return dict(self._learned)

    def restore_controller_memory(self, memory: dict) -> None:
        """Make ``memory`` (from :meth:`controller_memory`) what the next auto-budget calls start from:
        e.g. a benchmark repeating one prompt, so that no repeat learns from an earlier one."""
        with self._lock:
            self._learned = dict(memory)

    @property
    def learned_budget(self) -> dict[tuple[str, str, bool], int]:
        """(method, drafter, sampled) -> the budget the last auto-budget call of that kind settled on (its
        controller's choice; exploration steps may run others)."""
        with self._lock:
            return {key: controller.choice for key, controller in self._learned.items()}

    def _chunks(self, tokens: Iterator[int], stats: DecodeStats, stream: TextStream, stop: StopCondition) -> Iterator[str]:
        """Text chunks as tokens come (:class:`TextAssembler`); ``stream.result`` is set at the end."""
        assembler = self.text_assembler(stop)
        try:
            for token in tokens:
                text = assembler.push(token)
                if text:
                    yield text
        finally:
            tokens.close()
        rest, stream.result = assembler.finish(stats)
        if rest:
            yield rest

    def text_assembler(self, stop: StopCondition) -> "TextAssembler":
        """An incremental detokenizer for one request's tokens (what :meth:`stream` and the server emit)."""
        return TextAssembler(self._decode, stop, self._result)

    def _result(self, token_ids: list[int], stats: DecodeStats, stop: StopCondition) -> GenerationResult:
        return GenerationResult(text=_cut_at_stop(self._decode(token_ids), stop.stop_strings), token_ids=token_ids,
                                stats=stats, finish_reason=stop.finish_reason or "length",
                                stop_reason=stop.reason or "max_new_tokens", stop_string=stop.stop_string)

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
                raise TalonError("prompt: chat messages need a tokenizer with a chat template "
                                 "(this tokenizer has none: pass a plain string with chat_template=False)")
            ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            if hasattr(ids, "keys"):
                ids = ids["input_ids"]
        ids = torch.tensor(ids, dtype=torch.long).flatten()
        if ids.numel() == 0:
            raise bad_argument("prompt", prompt, "text that encodes to at least one token")
        return ids

    def _use_chat_template(self) -> bool:
        return self.chat_template and bool(getattr(self.tokenizer, "chat_template", None))

    def _drafter(self, tree_config: TreeConfig, drafter_name: str):
        if tree_config.method == "ar":
            return None
        if drafter_name == "ngram":
            return NgramDrafter(self.target.vocab_size)
        if drafter_name == "eagle3":
            if self.head is None:
                raise TalonError(f"draft: tree method {tree_config.method!r} with drafter 'eagle3' needs an EAGLE-3 head")
            return Eagle3Drafter(self.head)
        if self.draft_model is None:
            raise TalonError(f"draft: tree method {tree_config.method!r} needs a draft model (or drafter='ngram')")
        return ModelDrafter(CausalLM(self.draft_model, role="draft"), target_vocab_size=self.target.vocab_size)


def _initial_budget(method: str) -> int:
    from .config import METHOD_DEFAULTS

    return int(METHOD_DEFAULTS[method]["budget"])


def _cut_at_stop(text: str, stop_strings: tuple[str, ...]) -> str:
    """``text`` up to (not including) the earliest occurrence of any stop string."""
    cut = min((index for index in (text.find(s) for s in stop_strings) if index >= 0), default=-1)
    return text if cut < 0 else text[:cut]


def _stop_prefix_length(text: str, stop_strings: tuple[str, ...]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of a stop string (may still become one)."""
    longest = 0
    for stop in stop_strings:
        for length in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:length]):
                longest = length
                break
    return longest


def _tree_config(tree: str | TreeConfig, options: dict) -> TreeConfig:
    """The TreeConfig for ``tree`` with ``options`` applied, every field not overridden kept. A method
    name with no budget (and, for a chain, no depth) gets ``budget="auto"`` for talon/eagle/chain."""
    unknown = set(options) - set(TreeConfig.__dataclass_fields__)
    if unknown:
        raise TalonError(f"{sorted(unknown)[0]}: unknown option")
    options = {k: v for k, v in options.items() if v is not None}
    if isinstance(tree, TreeConfig):
        return tree.with_options(**options) if options else tree
    if not isinstance(tree, str):
        raise bad_argument("tree", tree, "a method name or a TreeConfig")
    if tree in AUTO_METHODS and "budget" not in options and not (tree == "chain" and "depth" in options):
        options["budget"] = AUTO
    return TreeConfig(method=tree, **options)


def _check_drafter(drafter: str) -> None:
    if drafter not in DRAFTERS:
        raise bad_argument("drafter", drafter, "one of " + ", ".join(DRAFTERS))
