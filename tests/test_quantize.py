"""Weight-only int4 / int8 linears: the GGUF Q4_K blocks taken exactly, and speculation exact against the
quantized target (the greedy oracle on tiny quantized models)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from conftest import VOCAB, plain_greedy, tiny_model
from helpers import make_drafter, run
from talon_sd.config import TreeConfig
from talon_sd.drafters import ModelDrafter
from talon_sd.kernels import as_quantized, native
from talon_sd.lm import CausalLM, linear_weights, pack_linears_for_cpu
from talon_sd.quantize import (
    GROUP_SIZE, QUANTIZED_ROWS, Int4Linear, Int4Weight, Int8Linear, int4_from_float, int4_from_q4k, int8_from_float,
    quantize_linears,
)

gguf = pytest.importorskip("gguf")
pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch's CPU int4 kernels")


def random_q4k(rows: int, columns: int, seed: int = 0) -> np.ndarray:
    """Raw bytes of a Q4_K tensor [rows, columns]: random quants, scales and mins, finite d and dmin."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(rows, columns // 256, 144), dtype=np.uint8)
    blocks[..., 0:2] = rng.uniform(0.001, 0.01, size=(rows, columns // 256, 1)).astype(np.float16).view(np.uint8)
    blocks[..., 2:4] = rng.uniform(0.001, 0.02, size=(rows, columns // 256, 1)).astype(np.float16).view(np.uint8)
    return blocks.reshape(rows, -1)


def test_q4k_blocks_become_int4_without_rounding():
    raw = random_q4k(48, 512)
    expected = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q4_K)  # [48, 512], ggml's own decoding
    int4 = int4_from_q4k(raw)
    assert int4.q.shape == (48, 512) and int4.q.max() <= 15
    assert int4.scale.shape == (48, 512 // GROUP_SIZE)
    np.testing.assert_allclose(int4.dequantize().numpy(), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("rows", [1, 2, 3, 9])
def test_int4_and_int8_linears_compute_their_weights_product(rows):
    torch.manual_seed(0)
    weight, bias = torch.randn(96, 128), torch.randn(96)
    x = torch.randn(2, rows, 128)
    int4 = int4_from_float(weight)
    assert (int4.dequantize() - weight).abs().max() < 0.5 * (weight.max() - weight.min()) / 15 + 1e-6
    q, scale = int8_from_float(weight)
    for linear, dense in [(Int4Linear(int4, bias), int4.dequantize()), (Int8Linear(q, scale, bias), q * scale[:, None])]:
        y = linear(x)
        assert y.shape == (2, rows, 96) and y.dtype == x.dtype
        expected = x @ dense.T + bias
        assert torch.allclose(y, expected, atol=0.05 * expected.abs().max())  # bfloat16 arithmetic
        alone = linear(x[:, :1])
        if 2 * rows <= QUANTIZED_ROWS:  # the quantized kernel: a row's result does not depend on the rows beside it
            assert torch.equal(alone, y[:, :1])
        else:  # the dense copy: the same weight, rounded alike, summed in another order
            assert torch.allclose(alone, y[:, :1], rtol=2 ** -6, atol=2 ** -6 * float(alone.abs().max()))


def test_int4_weight_checks_its_shapes():
    with pytest.raises(ValueError, match="scale/zero"):
        Int4Weight(torch.zeros(4, 64, dtype=torch.uint8), torch.zeros(4, 3), torch.zeros(4, 2))


def test_a_gguf_q4k_tensor_is_used_where_it_matches_the_loaded_weight(tmp_path):
    model = tiny_model("qwen2", seed=3, vocab=VOCAB)
    raw = random_q4k(64, 256, seed=4)  # o_proj of layer 0 is [hidden 64, 64]: too small for a Q4_K block
    model.model.layers[0].mlp.down_proj = torch.nn.Linear(256, 64, bias=False)  # [64, 256]: one block per row
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight.copy_(torch.from_numpy(
            gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q4_K)))
    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_tensor("blk.0.ffn_down.weight", raw, raw_shape=raw.shape, raw_dtype=gguf.GGMLQuantizationType.Q4_K)
    writer.add_tensor("blk.1.ffn_down.weight", raw, raw_shape=raw.shape, raw_dtype=gguf.GGMLQuantizationType.Q4_K)
    for write in (writer.write_header_to_file, writer.write_kv_data_to_file, writer.write_tensors_to_file):
        write()
    writer.close()
    counts = quantize_linears(model, "int4", str(path))
    # layer 0's down projection takes its GGUF blocks; layer 1's does not match its GGUF tensor and is quantized
    # from its float weight, as are the other linears; the output head goes to int8
    assert counts == {"int4 (Q4_K)": 1, "int4": 13, "int8": 1}
    layer0 = model.model.layers[0].mlp.down_proj
    x = torch.randn(3, 256)
    assert torch.equal(layer0(x), Int4Linear(int4_from_q4k(raw), None, torch.float32)(x))  # the model is float32


@pytest.mark.parametrize("mode", ["int4", "int8"])
@pytest.mark.parametrize("tree", [TreeConfig("talon", budget=8, topk=3), TreeConfig("talon", budget="auto", topk=4),
                                  TreeConfig("eagle", budget=8, topk=2, depth=3)], ids=lambda t: t.label)
def test_speculation_is_exact_against_the_quantized_target(mode, tree):
    target = tiny_model("llama", seed=0)
    draft = copy.deepcopy(target)
    for model in (target, draft):
        counts = quantize_linears(model, mode)
        assert sum(counts.values()) == 2 * 7 + 1  # 7 linears per layer and the head
    prompt = [5, 17, 33, 8, 5, 17]
    expected = plain_greedy(target, prompt, 40)
    tokens, stats = run(target, make_drafter("model", draft, VOCAB), tree, prompt, 40)
    assert tokens == expected
    assert stats.mat > 1.5  # the draft is the target itself: most drafts are accepted


def test_linear_weights_count_every_linear_but_the_output_however_stored():
    """What prices a sampled request's unmeasured catch-up (talon_sd.decoding): in x out of each linear, the output
    projection excepted, the same in float32, packed for the CPU, int8 and int4."""
    per_layer = 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128  # q, o; k, v (2 kv heads of 16); gate, up, down
    assert ModelDrafter(tiny_model("llama", layers=1)).linear_weights == per_layer
    for change in (None, pack_linears_for_cpu, lambda m: quantize_linears(m, "int8"),
                   lambda m: quantize_linears(m, "int4")):
        model = tiny_model("qwen", layers=2)
        if change is not None:
            change(model)
        assert linear_weights(model) == 2 * per_layer == CausalLM(model).linear_weights


def test_quantize_linears_refuses_an_unknown_mode():
    with pytest.raises(ValueError, match="'int4' or 'int8'"):
        quantize_linears(tiny_model("llama"), "int3")


def test_load_model_quantizes_on_request_and_names_a_bad_setting(tmp_path, monkeypatch):
    from talon_sd import models
    from talon_sd.errors import TalonError
    from talon_sd.lm import kernels_of
    from test_models import save_tiny_llama

    monkeypatch.setenv("TALON_SD_CACHE", str(tmp_path / "cache"))
    folder = save_tiny_llama(tmp_path / "tiny")
    loaded = models.load_model(str(folder), dtype="float32", device="cpu", quantize="int4")
    assert loaded.quantized == {"int4": 2 * 7, "int8": 1} and kernels_of(loaded.model) == "int4"
    assert models.load_model(str(folder), dtype="float32", device="cpu").quantized is None
    assert models.gguf_of(loaded.source) is None  # a saved folder, no GGUF behind it
    with pytest.raises(TalonError, match="^quantize: got 'int3', expected 'none', 'int4' or 'int8'"):
        models.load_model(str(folder), dtype="float32", device="cpu", quantize="int3")


@pytest.mark.skipif(native() is None, reason="the native kernels need AVX2 and a compiler")
@pytest.mark.parametrize("in_features", [96, 256])  # 3 groups (padded to a block of 8) and a whole block
def test_native_kernels_in_float32_models(in_features):
    torch.manual_seed(1)
    weight, bias = torch.randn(42, in_features), torch.randn(42)  # 42 outputs: the last int4 tile of eight part-filled
    int4 = int4_from_float(weight)
    q, scale = int8_from_float(weight)
    bf16 = lambda t: t.to(torch.bfloat16).float()  # the kernels keep scales (and int4 zeros) in bfloat16
    for linear, dense in [(Int4Linear(int4, bias, torch.float32), Int4Weight(int4.q, bf16(int4.scale), bf16(int4.zero)).dequantize()),
                          (Int8Linear(q, scale, bias, torch.float32), q.float() * bf16(scale)[:, None])]:
        assert linear.native and linear.dense is None  # no dense copy: every call runs the kernel
        x = torch.randn(70, in_features)  # more rows than any tree: a prefill
        y = linear(x)
        expected = as_quantized(x) @ dense.T + bias  # activations int8 per group of 32: the same numbers, summed in another order
        assert y.dtype == torch.float32
        assert torch.allclose(y, expected, rtol=1e-5, atol=1e-5 * float(expected.abs().max()))
        assert (y - (x @ dense.T + bias)).abs().max() < 0.05 * expected.abs().max()  # near the float product
        for row in (0, 4, 8, 69):  # a row's result does not depend on the rows beside it
            assert torch.equal(linear(x[row:row + 1]), y[row:row + 1])
        assert torch.equal(linear(x[3:12]), y[3:12])