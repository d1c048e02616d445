"""Weight-only quantized linears for CPU decoding: int4 in groups of 32 and int8 per output channel.

Decoding on a few CPU cores is bound by the bytes of weights each step reads. A dequantized bfloat16 model reads
two bytes a weight; these linears read half a byte (int4) or one (int8). Two kernel sets:

* **float32 models** (the default dtype on CPUs without AVX512-BF16 or AMX): :mod:`talon_sd.kernels`' native AVX2
  kernels, built on first use. They quantize each activation row to int8 per group of 32 and sum a group's
  integer products exactly; one [M, 1536] x [1536, 8960] linear on the AVX2 EPYC, 28 distinct weights, M = 1 / 4 /
  16 / 64: int4 0.35 / 0.53 / 2.15 / 7.46 ms, int8 0.60 / 0.90 / 4.51 / 13.86, against torch's int4 kernel 1.07 /
  2.22 / 7.97 / 26.90 and float32 3.06 / 9.45 / 10.77 / 20.94 (``scripts/matmul_paths.py --copies 28``). The int4
  kernel is faster than float32 at every row count measured (256 rows: 31 ms against about 55), the int8 one up to
  64 rows (about 1.15x float32's time at 256-512); they run every call, prefills included, so these linears keep
  no dense copy: the 1.5B int4 target takes 3.4 GB resident. Without AVX2 or a compiler, torch's kernels;
* **bfloat16 models**: torch's own CPU kernels (``aten._weight_int4pack_mm_for_cpu``, ``aten._weight_int8pack_mm``,
  vectorized for bfloat16 activations on AVX2 and AVX512).

Where the weights come from:

* a GGUF tensor stored as ``Q4_K`` becomes int4 **without any rounding**: a Q4_K super-block of 256 weights holds
  eight sub-blocks of 32, each ``w = d * sc * q - dmin * m`` with 4-bit ``q``; that is torch's int4 group of 32,
  ``w = (q - 8) * scale + zero``, with ``scale = d * sc`` and ``zero = 8 * scale - dmin * m``
  (:func:`int4_from_q4k`). The one loss is rounding ``scale`` and ``zero`` to bfloat16, the kernel's format;
* every other linear is quantized from its float weight: int4 by each group's minimum and maximum
  (:func:`int4_from_float`), int8 symmetric per output channel (:func:`int8_from_float`).

Under ``int4``, tensors a GGUF keeps at 6 or 8 bits (:data:`HIGH_PRECISION`; llama.cpp's "_M" mixes put half
the value and down projections and the output head there for quality) go to int8, as any model's output head
does (an int4 head would read one row of the 1.5B target's in 6.6 ms against 13.1, EPYC AVX512-BF16, but agreed
with the dequantized model's argmax on 94.3% of positions against 98.9%); the token embedding is a lookup and stays
as loaded.

**With torch's kernels many rows run dense.** They cost more per row past a few rows (they dequantize per block of
rows): one [M, 1536] x [1536, 8960] linear, M = 1 / 4 / 8 / 16 / 64 rows, 0.40 / 0.78 / 1.59 / 2.66 / 10.95 ms int4
against 1.20 / 1.45 / 1.39 / 2.21 / 5.47 ms bfloat16 (EPYC AVX512-BF16; ``scripts/matmul_paths.py``), so there a
call of more than :data:`QUANTIZED_ROWS` rows (a prefill, a wide tree) multiplies by a dense copy of the same
weight, kept in the dtype the linear had: a 200-token prefill of the 1.5B target took 2.0 s against 4.5 s through
the int4 kernel. The copy costs that dtype's bytes per weight: such a model takes the memory of the model as loaded
plus its quantized weights, and saves bytes read per decoding step, not memory.

Exactness: natively a linear's row never depends on how many rows share the matmul (tested), and on the tiny float32
test models speculation reproduces plain decoding exactly. On real models the rest of a tree's forward (attention
over other shapes) rounds differently from a plain step's, and a last-bit difference can move an activation's int8
rounding, so greedy text can leave plain decoding's at near-ties of the quantized target (docs/BENCHMARKS.md
section 6: margins 0.015-0.10). With torch's kernels a row's result is independent up to :data:`QUANTIZED_ROWS`
rows; past that the dense copy gives the same products rounded alike (bfloat16 in and out), summed in another order:
near-ties again, as in bfloat16.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from .kernels import GROUP, native, pack_int4, pad_columns, padded_groups

GROUP_SIZE = GROUP  # weights per int4 group (one Q4_K sub-block; the native kernels' group)
Q4K_BLOCK_BYTES = 144  # d (f16), dmin (f16), 12 bytes of 6-bit scales and mins, 128 bytes of 4-bit quants
HIGH_PRECISION = ("Q6_K", "Q8_0", "Q8_K")  # GGUF types that go to int8, not int4
QUANTIZED_ROWS = 4  # calls of more rows run the dense copy (module docstring)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Int4Weight:
    """A [out, in] weight as ``w = (q - 8) * scale + zero`` per group of :data:`GROUP_SIZE` inputs."""

    q: torch.Tensor  # [out, in] uint8 in 0..15
    scale: torch.Tensor  # [out, in / 32] float32
    zero: torch.Tensor  # [out, in / 32] float32

    def __post_init__(self) -> None:
        out_features, in_features = self.q.shape
        groups = (out_features, in_features // GROUP_SIZE)
        if in_features % GROUP_SIZE or tuple(self.scale.shape) != groups or tuple(self.zero.shape) != groups:
            raise ValueError(f"Int4Weight: q {tuple(self.q.shape)} needs in % {GROUP_SIZE} == 0 and scale/zero "
                             f"{groups}; got {tuple(self.scale.shape)} / {tuple(self.zero.shape)}")

    def dequantize(self) -> torch.Tensor:
        """The float32 weight [out, in] these numbers stand for."""
        expand = lambda t: t.repeat_interleave(GROUP_SIZE, dim=1)  # noqa: E731  [out, in / 32] -> [out, in]
        return (self.q.float() - 8) * expand(self.scale) + expand(self.zero)


def int4_from_q4k(raw: np.ndarray) -> Int4Weight:
    """The int4 form of a GGUF ``Q4_K`` tensor given as its raw bytes ``[out, in / 256 * 144]`` (uint8), exactly
    (layout: ggml's ``block_q4_K`` and ``get_scale_min_k4``)."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    out_features = raw.shape[0]
    blocks = raw.reshape(out_features, -1, Q4K_BLOCK_BYTES)  # [out, blocks, 144]
    d = blocks[..., 0:2].copy().view(np.float16).astype(np.float32)  # [out, blocks, 1]
    dmin = blocks[..., 2:4].copy().view(np.float16).astype(np.float32)  # [out, blocks, 1]
    packed = blocks[..., 4:16].astype(np.uint8)  # [out, blocks, 12]
    low, high = packed[..., 0:4], packed[..., 4:8]
    tail = packed[..., 8:12]
    sc = np.concatenate([low & 63, (tail & 0xF) | ((low >> 6) << 4)], axis=-1)  # [out, blocks, 8]
    mn = np.concatenate([high & 63, (tail >> 4) | ((high >> 6) << 4)], axis=-1)  # [out, blocks, 8]
    quants = blocks[..., 16:].reshape(out_features, -1, 4, 32)  # [out, blocks, 4, 32]: two sub-blocks each
    q = np.stack([quants & 0xF, quants >> 4], axis=3)  # [out, blocks, 4, 2, 32]: low nibbles first
    scale = d * sc  # [out, blocks, 8]
    zero = 8 * scale - dmin * mn
    return Int4Weight(torch.from_numpy(q.reshape(out_features, -1)),
                      torch.from_numpy(scale.reshape(out_features, -1)),
                      torch.from_numpy(zero.reshape(out_features, -1)))


def int4_from_float(weight: torch.Tensor) -> Int4Weight:
    """Asymmetric int4 of a float weight [out, in] by each group's minimum and maximum (in % 32 == 0)."""
    out_features, in_features = weight.shape
    if in_features % GROUP_SIZE:
        raise ValueError(f"int4 needs in_features % {GROUP_SIZE} == 0, got {in_features}")
    groups = weight.detach().float().reshape(out_features, -1, GROUP_SIZE)  # [out, in / 32, 32]
    low, high = groups.amin(dim=-1), groups.amax(dim=-1)  # [out, in / 32]
    scale = ((high - low) / 15).clamp_min(torch.finfo(torch.float32).tiny)
    q = torch.round((groups - low[..., None]) / scale[..., None]).clamp(0, 15).to(torch.uint8)
    return Int4Weight(q.reshape(out_features, in_features), scale, low + 8 * scale)


def int8_from_float(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per output channel of a float weight [out, in]: ``(q [out, in] int8, scale [out] float32)``."""
    weight = weight.detach().float()
    scale = (weight.abs().amax(dim=1) / 127).clamp_min(torch.finfo(torch.float32).tiny)  # [out]
    q = torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale


class _WeightOnlyLinear(torch.nn.Module):
    """``y = x @ w.T + bias`` on CPU through a subclass's quantized kernel: natively (:attr:`native`, float32
    models) for every call; with torch's kernels (bfloat16) up to :data:`QUANTIZED_ROWS` rows, more rows (a
    prefill, a wide verify) through ``dense``, the same weight dequantized to ``dense_dtype`` (module docstring:
    measured faster there; it costs ``dense_dtype``'s bytes per weight). ``dense`` builds that copy, called only
    where it is kept."""

    kind = ""  # what extra_repr says of the weight

    def __init__(self, out_features: int, in_features: int, bias: torch.Tensor | None, dense_dtype: torch.dtype,
                 dense: Callable[[], torch.Tensor]) -> None:
        super().__init__()
        self.out_features, self.in_features = out_features, in_features
        self.native = dense_dtype == torch.float32 and native() is not None  # float32 in and out (module docstring)
        bias_dtype = torch.float32 if self.native else torch.bfloat16
        self.register_buffer("bias", None if bias is None else bias.detach().to(bias_dtype).clone())
        self.register_buffer("dense", None if self.native else dense().to(dense_dtype).contiguous())  # [out, in]

    def _rows_times_weight(self, rows: torch.Tensor) -> torch.Tensor:
        """[rows, in] -> [rows, out] through the quantized kernel: float32 where :attr:`native`, else bfloat16."""
        raise NotImplementedError

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        """x [rows, in] -> [rows, out] in the kernel's activation dtype (float32 where :attr:`native`, else
        bfloat16): :meth:`forward` without its reshapes and conversions (:mod:`talon_sd.decoder` calls it)."""
        if self.dense is not None and x.shape[0] > QUANTIZED_ROWS:  # rounded as the kernel rounds: bfloat16
            y = (x.to(self.dense.dtype) @ self.dense.T).to(x.dtype)  # [rows, out]
        else:
            y = self._rows_times_weight(x.contiguous())  # [rows, out]
        return y if self.bias is None else y.add_(self.bias)  # y is new: the kernel's or the matmul's output

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        rows = x.reshape(-1, self.in_features).to(torch.float32 if self.native else torch.bfloat16)  # [rows, in]
        return self.rows(rows).reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        rows = ("native" if self.dense is None else
                f"more than {QUANTIZED_ROWS} rows {str(self.dense.dtype).removeprefix('torch.')}")
        return f"in_features={self.in_features}, out_features={self.out_features}, {self.kind}, {rows}"


class Int4Linear(_WeightOnlyLinear):
    """``y = x @ w.T + bias`` with ``w`` an :class:`Int4Weight`."""

    kind = f"int4 group {GROUP_SIZE}"

    def __init__(self, weight: Int4Weight, bias: torch.Tensor | None, dense_dtype: torch.dtype = torch.bfloat16) -> None:
        scale, zero = weight.scale.to(torch.bfloat16), weight.zero.to(torch.bfloat16)  # the kernel's format
        super().__init__(*weight.q.shape, bias, dense_dtype,
                         lambda: Int4Weight(weight.q, scale.float(), zero.float()).dequantize())
        if self.native:
            packed, scale, zero = pack_int4(weight.q, scale, zero)  # tiles of eight outputs (talon_sd.kernels)
            self.register_buffer("packed", packed)  # [ceil(out / 8), in / 32, 128] uint8
            self.register_buffer("scale", scale)  # [ceil(out / 8), in / 32, 8] bfloat16
            self.register_buffer("zero", zero)  # the same
            return
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(weight.q.to(torch.int32).contiguous(), 1)
        self.register_buffer("packed", packed)
        scales_and_zeros = torch.stack([scale.t(), zero.t()], dim=-1)  # [in / 32, out, 2]
        self.register_buffer("scales_and_zeros", scales_and_zeros.contiguous())

    def _rows_times_weight(self, rows: torch.Tensor) -> torch.Tensor:
        if self.native:
            return native().int4_matmul(rows, self.packed, self.scale, self.zero, self.out_features)
        return torch.ops.aten._weight_int4pack_mm_for_cpu(rows, self.packed, GROUP_SIZE, self.scales_and_zeros)


class Int8Linear(_WeightOnlyLinear):
    """``y = x @ (q * scale).T + bias`` with int8 ``q`` per output channel."""

    kind = "int8 per channel"

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None,
                 dense_dtype: torch.dtype = torch.bfloat16) -> None:
        super().__init__(*q.shape, bias, dense_dtype, lambda: q.float() * scale.to(torch.bfloat16).float()[:, None])
        columns = padded_groups(self.in_features) * GROUP_SIZE if self.native else self.in_features
        self.register_buffer("q", pad_columns(q, columns))  # [out, in (padded where native)] int8
        rounded = scale.to(torch.bfloat16)  # [out], as the dense copy has it
        self.register_buffer("scale", rounded.float() if self.native else rounded)

    def _rows_times_weight(self, rows: torch.Tensor) -> torch.Tensor:
        if self.native:
            return native().int8_matmul(rows, self.q, self.scale)
        return torch.ops.aten._weight_int8pack_mm(rows, self.q, self.scale)


def gguf_tensors(gguf_path: str, model) -> dict[str, tuple[str, np.ndarray]]:
    """``{linear module name: (GGUF quantization type name, raw data)}`` for the linears of ``model`` (an HF model
    loaded from the GGUF file at ``gguf_path``), through gguf's own name map for the model's architecture."""
    import gguf

    reader = gguf.GGUFReader(gguf_path)
    by_name = {tensor.name: tensor for tensor in reader.tensors}
    arch_name = str(reader.fields["general.architecture"].contents())
    arch = next((a for a, name in gguf.MODEL_ARCH_NAMES.items() if name == arch_name), None)
    if arch is None:
        return {}
    name_map = gguf.get_tensor_name_map(arch, model.config.num_hidden_layers)
    found = {}
    for module_name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        gguf_name = name_map.get_name(module_name)
        tensor = by_name.get(f"{gguf_name}.weight") if gguf_name else None
        if tensor is not None:
            found[module_name] = (tensor.tensor_type.name, tensor.data)
    return found


def _matches(int4: Int4Weight, weight: torch.Tensor, rows: int = 8) -> bool:
    """Whether the first ``rows`` rows of ``int4`` dequantize to ``weight``'s (a loader may permute rows, as
    transformers does for Llama's query and key projections)."""
    head = Int4Weight(int4.q[:rows], int4.scale[:rows], int4.zero[:rows]).dequantize()  # [rows, in]
    expected = weight[:rows].detach().float()
    return bool(torch.allclose(head, expected, rtol=1e-2, atol=1e-2 * float(expected.abs().max())))


def quantize_linears(model, mode: str, gguf_path: str | None = None) -> dict[str, int]:
    """Replace the ``nn.Linear`` modules of a CPU model by :class:`Int4Linear` / :class:`Int8Linear` (``mode``
    ``"int4"`` or ``"int8"``); ``gguf_path``: the GGUF the model was loaded from, whose Q4_K tensors are taken as
    they are (module docstring). Each keeps its dense copy in the dtype the linear had. Returns how many linears
    became what, e.g. ``{"int4 (Q4_K)": 168, "int8": 29}``. Linears whose input size is not a multiple
    of 32 stay as they are."""
    if mode not in ("int4", "int8"):
        raise ValueError(f"quantize_linears: mode must be 'int4' or 'int8', got {mode!r}")
    stored = gguf_tensors(gguf_path, model) if (gguf_path and mode == "int4") else {}
    counts: dict[str, int] = {}
    for name, module in list(model.named_modules()):
        if not isinstance(module, torch.nn.Linear) or module.in_features % GROUP_SIZE:
            continue
        kind, replacement = _quantized(name, module, mode, stored.get(name))
        model.set_submodule(name, replacement)
        counts[kind] = counts.get(kind, 0) + 1
    return counts


def _quantized(name: str, linear: torch.nn.Linear, mode: str, stored) -> tuple[str, torch.nn.Module]:
    """One linear's replacement and what it became."""
    dense_dtype = linear.weight.dtype
    if mode == "int4" and stored is not None and stored[0] == "Q4_K":
        int4 = int4_from_q4k(stored[1])
        if int4.q.shape == linear.weight.shape and _matches(int4, linear.weight):
            return "int4 (Q4_K)", Int4Linear(int4, linear.bias, dense_dtype)
        logger.info("%s: the GGUF's Q4_K rows do not match the loaded weight; quantizing it from float", name)
    if mode == "int8" or (stored is not None and stored[0] in HIGH_PRECISION) or _is_output_head(name):
        return "int8", Int8Linear(*int8_from_float(linear.weight), linear.bias, dense_dtype)
    return "int4", Int4Linear(int4_from_float(linear.weight), linear.bias, dense_dtype)


def _is_output_head(name: str) -> bool:
    return name.split(".")[-1] in ("lm_head", "output", "embed_out")
