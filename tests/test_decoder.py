"""The lean decoder (talon_sd.decoder) computes what transformers' forward computes, bit for bit, and stays out
of the way of models it does not know. (CPU: the lean decoder needs the grouped attention, CUDA runs sdpa.)"""

from __future__ import annotations

import pytest
import torch
from transformers import MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

from conftest import DEVICE, tiny_model
from talon_sd.kernels import native
from talon_sd.lm import CausalLM, int8_available, pack_linears_for_cpu, quantize_linears_int8
from talon_sd.quantize import quantize_linears
from talon_sd.tree import DraftTree

pytestmark = pytest.mark.skipif(DEVICE.type != "cpu", reason="the lean decoder runs with the CPU's grouped attention")


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
    outputs.append(lm.forward(torch.tensor([16, 9, 12, 2]), last_only=True))  # the head still runs on every row
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


@pytest.mark.skipif(native() is None, reason="the native kernels run on a CPU with AVX2")
@pytest.mark.parametrize("mode", ["int4", "int8"])
def test_lean_forward_calls_the_quantized_kernels_as_transformers_would(mode):
    model = tiny_model("qwen2")
    quantize_linears(model, mode)
    _assert_equal_to_transformers(model, capture=(1,))


@pytest.mark.parametrize("kernels", ["packed", "dynamic int8"])
def test_lean_forward_with_the_draft_s_cpu_kernels(kernels):
    model = tiny_model("llama")
    if kernels == "packed":
        assert pack_linears_for_cpu(model) or pytest.skip("torch without oneDNN")
    else:
        assert int8_available() or pytest.skip("no x86 quantized engine")
        quantize_linears_int8(model)
    _assert_equal_to_transformers(model)


def _small(config_class, model_class, **extra):
    config = config_class(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, **extra)
    config._attn_implementation = "grouped"
    return model_class(config).eval()


def test_models_it_does_not_know_run_transformers_forward():
    eager = tiny_model("llama")
    eager.config._attn_implementation = "eager"
    assert CausalLM(eager).lean is None
    sliding_qwen = _small(Qwen2Config, Qwen2ForCausalLM, use_sliding_window=True, sliding_window=4, max_window_layers=1)
    assert "sliding_attention" in sliding_qwen.config.layer_types
    assert CausalLM(sliding_qwen).lean is None
    assert CausalLM(_small(MistralConfig, MistralForCausalLM, sliding_window=4)).lean is None
    mistral = _small(MistralConfig, MistralForCausalLM, sliding_window=None)
    assert CausalLM(mistral).lean is not None
    _assert_equal_to_transformers(mistral)
