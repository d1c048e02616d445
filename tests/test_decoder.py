"""The lean decoder (talon_sd.decoder) computes what transformers' forward computes, bit for bit, and stays out
of the way of models it does not know."""

from __future__ import annotations

import copy

import pytest
import torch

from conftest import DEVICE, tiny_model
from talon_sd.kernels import native
from talon_sd.lm import CausalLM
from talon_sd.quantize import quantize_linears
from talon_sd.tree import DraftTree


def _tree(root: int) -> DraftTree:
    tree = DraftTree.root(root)
    tree = tree.extend(torch.zeros(3, dtype=torch.long), torch.tensor([7, 9, 11]), torch.zeros(3))
    return tree.extend(torch.tensor([1, 1, 3]), torch.tensor([12, 13, 14]), torch.zeros(3))


def _run(lm: CausalLM, capture: tuple[int, ...]):
    """Prefill, a one-token step, a tree verify, a compaction and a three-token step; every output."""
    outputs = [lm.prefill(torch.tensor([5, 17, 33, 8, 21, 40]), capture=capture)]
    outputs.append(lm.forward(torch.tensor([3]), capture=capture))
    tree = _tree(4)
    outputs.append(lm.forward_tree(tree, capture=capture))
    lm.commit_tree(tree.size, [0, 1, 4])
    outputs.append(lm.forward(torch.tensor([6, 2, 30]), capture=capture))
    outputs.append(lm.forward(torch.tensor([15]), last_only=True))
    outputs.append(torch.cat([layer.keys for layer in lm.cache.cache.layers]))
    return outputs


def _flat(outputs):
    for output in outputs:
        if isinstance(output, tuple):
            yield from _flat(output)
        elif output is not None:
            yield output


def _assert_equal_to_transformers(model, capture=()):
    lean, reference = CausalLM(model), CausalLM(model)
    assert lean.lean is not None
    reference.lean = None  # transformers' own forward
    for got, expected in zip(_flat(_run(lean, capture)), _flat(_run(reference, capture)), strict=True):
        assert got.shape == expected.shape
        assert torch.equal(got, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_lean_forward_equals_transformers_bit_for_bit(kind, dtype):
    model = tiny_model(kind, layers=3).to(dtype)
    _assert_equal_to_transformers(model, capture=(0, 2, 2))
    _assert_equal_to_transformers(model)


@pytest.mark.skipif(DEVICE.type != "cpu" or native() is None, reason="the native kernels run on a CPU with AVX2")
@pytest.mark.parametrize("mode", ["int4", "int8"])
def test_lean_forward_calls_the_quantized_kernels_as_transformers_would(mode):
    model = tiny_model("qwen2")
    quantize_linears(model, mode)
    _assert_equal_to_transformers(model)


def test_models_it_does_not_know_run_transformers_forward():
    eager = copy.deepcopy(tiny_model("llama"))
    eager.config._attn_implementation = "eager"
    assert CausalLM(eager).lean is None
    sliding = tiny_model("qwen2")
    sliding.config.use_sliding_window, sliding.config.sliding_window = True, 4
    assert CausalLM(sliding).lean is None
