"""The methods a benchmark compares, and how one generation of each is run and timed.

Methods, registered by name in :data:`RUNNERS`:

* ``ar``           our decoding loop with the root-only tree: plain greedy / sampling, the baseline
* ``hf``           plain ``transformers`` ``generate`` on the target
* ``hf-assisted``  ``transformers`` assisted generation, ``assistant_model=`` the same draft model
                   (its own defaults: see :func:`assistant_settings`)
* ``chain``, ``static``, ``eagle``, ``talon``  our loop with that tree builder (:class:`TreeConfig`)
* ``llamacpp``, ``llamacpp-lookup``  llama.cpp on the target's GGUF file, plain and with prompt lookup
                   (:mod:`talon_sd.bench.llamacpp`; needs llama-cpp-python)

A :class:`Variant` is one method with one configuration and a unique ``label`` (the results key):
``talon`` in a benchmark, ``talon(N=32,K=4,mu=0.03)`` in a sweep. A tree method may name its drafter
after an ``@`` (``talon@eagle3``, ``eagle@eagle3``, ``chain@ngram``): methods on different drafters
then run side by side in one interleaved run (the generator must hold what each drafter needs).

Timing contract: every method is timed the same way, wall clock around the whole call (prefill
included, detokenization excluded), from the same prompt ids, with the same stopping rule
(``max_new_tokens`` or an EOS id of the generator; the EOS token counts as a new token).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Callable, Sequence

import torch

from ..config import TreeConfig
from ..errors import bad_argument
from ..stats import DecodeStats
from . import llamacpp
from .llamacpp import LLAMACPP_METHODS

METHODS = ("ar", "hf", "hf-assisted", "chain", "static", "eagle", "talon", *LLAMACPP_METHODS)
HF_METHODS = ("hf", "hf-assisted")
TREELESS_METHODS = (*HF_METHODS, *LLAMACPP_METHODS)  # run outside our loop: no tree, no drafter, no stats


@dataclass(frozen=True)
class Decoding:
    """How every method decodes: greedy when ``temperature == 0``, else sampling with a per-prompt seed."""

    max_new_tokens: int = 128
    temperature: float = 0.0
    seed: int = 0  # sampling seed of prompt i is seed + i, the same for every method

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class Variant:
    """One method in one configuration; ``tree`` is None for the :data:`TREELESS_METHODS`."""

    label: str
    method: str
    tree: TreeConfig | None = None
    tuned: bool = False  # the tree options came from the tuned profile (``tuned``)
    drafter: str | None = None  # None: the generator's own drafter

    def describe(self) -> dict:
        tree = None
        if self.tree is not None:
            tree = {k: (list(map(list, v)) if k == "static_paths" and v else v) for k, v in asdict(self.tree).items()}
        return {"label": self.label, "method": self.method, "tree": tree, "tuned": self.tuned, "drafter": self.drafter}


@dataclass
class Outcome:
    """One timed generation."""

    token_ids: list[int]
    seconds: float  # wall clock around the call, prefill included
    stats: DecodeStats | None  # our loop's per-call stats; None for the TREELESS_METHODS


def parse_methods(text: str | Sequence[str] | None, allowed: Sequence[str] = METHODS) -> list[str]:
    """Validated method names in the order given, without duplicates."""
    from .datasets import split_list

    from ..drafters import DRAFTERS

    names = split_list(text)
    expected = "some of " + ", ".join(allowed) + " (comma-separated; a tree method may add @drafter, e.g. talon@eagle3)"
    if not names:
        raise bad_argument("methods", text, expected)
    for name in names:
        method, _, drafter = name.partition("@")
        if method not in allowed or (drafter and (method in TREELESS_METHODS or method == "ar" or drafter not in DRAFTERS)):
            raise bad_argument("methods", name, expected)
    return list(dict.fromkeys(names))


def run_variant(generator, variant: Variant, prompt_ids: torch.Tensor, decoding: Decoding, seed: int) -> Outcome:
    """Generate once with ``variant`` for ``prompt_ids`` [L] and time it (see the module contract)."""
    return RUNNERS[variant.method](generator, variant, prompt_ids, decoding, seed)


def split_method(name: str) -> tuple[str, str | None]:
    """``talon@eagle3`` -> ("talon", "eagle3"); ``talon`` -> ("talon", None)."""
    method, _, drafter = name.partition("@")
    return method, drafter or None


def _run_tree(generator, variant: Variant, prompt_ids: torch.Tensor, decoding: Decoding, seed: int) -> Outcome:
    started = time.perf_counter()
    tokens, stats = generator.token_stream(
        input_ids=prompt_ids, max_new_tokens=decoding.max_new_tokens, do_sample=not decoding.greedy,
        temperature=decoding.temperature if not decoding.greedy else 1.0, top_p=1.0, top_k=0, seed=seed,
        tree=variant.tree, **({"drafter": variant.drafter} if variant.drafter else {}),
    )
    token_ids = list(tokens)
    return Outcome(token_ids, time.perf_counter() - started, stats)


def _run_hf(generator, variant: Variant, prompt_ids: torch.Tensor, decoding: Decoding, seed: int,
            assistant=None) -> Outcome:
    model = generator.target_model
    device = generator.target.device
    input_ids = prompt_ids.to(device)[None]  # [1, L]
    config = hf_generation_config(generator, decoding)
    started = time.perf_counter()
    if not decoding.greedy:
        torch.manual_seed(seed)
    with torch.inference_mode():
        output = model.generate(
            input_ids, attention_mask=torch.ones_like(input_ids), generation_config=config,
            assistant_model=assistant,
        )
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - started
    return Outcome(output[0, input_ids.shape[1]:].tolist(), seconds, None)


def _run_hf_assisted(generator, variant: Variant, prompt_ids: torch.Tensor, decoding: Decoding, seed: int) -> Outcome:
    if generator.draft_model is None:
        raise bad_argument("methods", "hf-assisted", "a generator with a draft model")
    return _run_hf(generator, variant, prompt_ids, decoding, seed, assistant=generator.draft_model)


def _run_llamacpp(generator, variant: Variant, prompt_ids: torch.Tensor, decoding: Decoding, seed: int) -> Outcome:
    return Outcome(*llamacpp.generate(generator, variant.method, prompt_ids, decoding, seed), None)


RUNNERS: dict[str, Callable[..., Outcome]] = {
    "ar": _run_tree, "chain": _run_tree, "static": _run_tree, "eagle": _run_tree, "talon": _run_tree,
    "hf": _run_hf, "hf-assisted": _run_hf_assisted, "llamacpp": _run_llamacpp,
    "llamacpp-lookup": _run_llamacpp,
}


def hf_generation_config(generator, decoding: Decoding):
    """The ``GenerationConfig`` of the hf methods: every sampling knob explicit, so that a model's own
    generation defaults (e.g. Qwen's top_k=20, repetition_penalty=1.1) cannot make ``hf`` decode
    differently from our loop; stops on the generator's EOS ids, like our loop."""
    from transformers import GenerationConfig

    eos = sorted(generator.eos_token_ids)
    pad = getattr(generator.target_model.generation_config, "pad_token_id", None)
    sampling = {"temperature": decoding.temperature, "top_p": 1.0, "top_k": 0} if not decoding.greedy else {}
    return GenerationConfig(
        max_new_tokens=decoding.max_new_tokens, min_new_tokens=0, do_sample=not decoding.greedy, **sampling,
        repetition_penalty=1.0, num_beams=1, eos_token_id=eos or None,
        pad_token_id=pad if pad is not None else (eos[0] if eos else None),
    )


def assistant_settings(generator) -> dict | None:
    """What ``hf-assisted`` uses for the assistant: transformers' defaults merged with the draft's own
    generation config (recorded in the results; nothing is changed)."""
    if generator.draft_model is None:
        return None
    config = generator.draft_model.generation_config
    defaults = config._get_default_generation_params() if hasattr(config, "_get_default_generation_params") else {}
    keys = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold",
            "assistant_lookbehind", "target_lookbehind")
    settings = {}
    for key in keys:
        value = getattr(config, key, None)
        settings[key] = value if value is not None else defaults.get(key)
    try:  # with scikit-learn, transformers adapts the confidence threshold during generation
        from transformers.utils import is_sklearn_available

        settings["adaptive_confidence_threshold"] = bool(is_sklearn_available())
    except ImportError:
        settings["adaptive_confidence_threshold"] = None
    return settings


def hf_settings(generator, decoding: Decoding) -> dict:
    """The hf methods' generation settings, for the results file."""
    config = hf_generation_config(generator, decoding)
    keys = ("max_new_tokens", "do_sample", "temperature", "top_p", "top_k", "repetition_penalty", "num_beams",
            "eos_token_id", "pad_token_id")
    return {key: getattr(config, key) for key in keys}


AUTO = "auto"  # the online controller sets the budget every step
TUNED = "tuned"  # the fixed options `talon tune` picked for this machine
TUNED_KEY = {"chain": "depth", "static": "budget", "eagle": "budget", "talon": "budget"}  # the flag that takes them


def bench_variants(methods: Sequence[str], overrides: dict[str, dict] | None = None,
                   tuned: Callable[[str], dict] | None = None) -> list[Variant]:
    """One variant per method, labelled by the method name.

    ``overrides[method]`` holds TreeConfig fields (``budget``, ``topk``, ``mu``, ``depth``; None = the
    method default). In a method's :data:`TUNED_KEY` field, ``"tuned"`` takes every tuned option of
    that method from ``tuned(method)`` (the machine profile written by ``talon tune``), explicit fields
    still winning; ``"auto"`` gives the method the online budget controller (talon, eagle, chain).
    ``ar`` is always included, first, as the speedup baseline.
    """
    overrides = overrides or {}
    names = list(dict.fromkeys(["ar", *methods]))
    variants = []
    for name in names:
        method, drafter = split_method(name)
        options = {k: v for k, v in (overrides.get(method) or {}).items() if v is not None}
        is_tuned = any(v == TUNED for v in options.values())
        if is_tuned:
            if tuned is None:
                raise bad_argument(TUNED_KEY.get(method, "budget"), TUNED, "a number (no tuned profile is available here)")
            explicit = {k: v for k, v in options.items() if v != TUNED}
            options = {**tuned(method), **explicit}
        if method == "chain" and options.get("depth") == AUTO:
            options = {**options, "depth": None, "budget": AUTO}
        if method in TREELESS_METHODS:
            variants.append(Variant(label=name, method=method))
        else:
            variants.append(Variant(label=name, method=method, tree=TreeConfig(method=method, **options),
                                    tuned=is_tuned, drafter=drafter))
    return variants
