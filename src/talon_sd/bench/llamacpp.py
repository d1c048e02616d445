"""llama.cpp baselines for ``talon bench``, on the target's own GGUF file, through llama-cpp-python.

* ``llamacpp``         llama.cpp's plain decoding
* ``llamacpp-lookup``  llama.cpp with its prompt-lookup drafter (``LlamaPromptLookupDecoding``, the
                       ``num_pred_tokens`` llama-cpp-python's README advises for CPU-only machines)

Optional: ``pip install llama-cpp-python`` (built from source where no wheel fits; about 10 minutes on 2 cores);
not part of the test install. Timed as every method is (:mod:`talon_sd.bench.methods`): the same prompt ids (chat
template applied), the same number of threads as torch, the same ``max_new_tokens`` and EOS ids, greedy
(``top_k=1``) or the same temperature with no other warper, prefill included. llama.cpp keeps the previous prompt
in its cache and would skip a repeated prefix; the cache is reset before every call, so each round prefills.
"""

from __future__ import annotations

import functools
import time

import torch

from ..errors import TalonError, bad_argument

LLAMACPP_METHODS = ("llamacpp", "llamacpp-lookup")
CONTEXT = 4096  # llama.cpp's context for one prompt and its answer (the bench prompts are under 1,000 tokens)
LOOKUP_TOKENS = 2  # llama-cpp-python's README: 10 for GPUs, 2 "performs better for cpu-only machines"


def available() -> bool:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


def check_available(method: str, generator=None) -> None:
    """A clear error, before anything runs, when ``method`` cannot run here (or with ``generator``)."""
    if not available():
        raise TalonError(f"methods: {method} needs llama-cpp-python: pip install llama-cpp-python "
                         "(a source build, about 10 minutes on 2 cores)")
    if generator is not None and generator.target_gguf is None:
        raise bad_argument("methods", method, "a target loaded from a GGUF file (a built-in model or a .gguf path) "
                                              "for the llama.cpp methods")


@functools.lru_cache(maxsize=2)
def _engine(gguf_path: str, threads: int, lookup: bool):
    import llama_cpp
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    # logits_all: a draft model needs every position's logits (llama-cpp-python sizes its buffer by this argument)
    return llama_cpp.Llama(model_path=gguf_path, n_ctx=CONTEXT, n_threads=threads, n_threads_batch=threads,
                           draft_model=LlamaPromptLookupDecoding(num_pred_tokens=LOOKUP_TOKENS) if lookup else None,
                           logits_all=lookup, verbose=False)


def generate(generator, method: str, prompt_ids: torch.Tensor, decoding, seed: int) -> tuple[list[int], float]:
    """One timed generation of ``method`` for ``prompt_ids`` [L]: ``(token ids, seconds)``; ``decoding`` is the
    benchmark's :class:`~talon_sd.bench.methods.Decoding`."""
    check_available(method, generator)
    llm = _engine(generator.target_gguf, torch.get_num_threads(), method == "llamacpp-lookup")
    if decoding.greedy:
        sampling = {"temp": 0.0, "top_k": 1}
    else:
        sampling = {"temp": decoding.temperature, "top_k": 0, "top_p": 1.0, "min_p": 0.0}
        llm.set_seed(seed)
    llm.reset()  # no prefix served from the previous call's cache
    token_ids: list[int] = []
    started = time.perf_counter()
    for token in llm.generate(prompt_ids.tolist(), repeat_penalty=1.0, **sampling):
        token_ids.append(int(token))
        if token in generator.eos_token_ids or len(token_ids) >= decoding.max_new_tokens:
            break
    return token_ids, time.perf_counter() - started
