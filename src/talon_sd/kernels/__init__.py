"""Native CPU kernels: float32 activations times int4 / int8 weights (``qmatmul.cpp``, AVX2 + FMA, and the int4
kernel's integer dots in AVX512-VNNI where the CPU has it: the same exact sums).

:func:`native` builds them on first use with torch's C++ extension loader (a compiler and ninja needed; about a
minute, then cached under ``~/.cache/torch_extensions``) and returns the module, or None where the CPU lacks AVX2,
the build fails (logged once) or ``TALON_NATIVE_KERNELS=0``. Their contract (``qmatmul.cpp``): each activation row
is quantized to int8 per group of 32, a group's integer products summed exactly, so a row's result depends on that
row and the weight only, never on the other rows of the call.

    int4_matmul(x [M, K] float32, packed [T, K / 32, 128] uint8, scale [T, K / 32, 8] bfloat16, zero (the same), N)
        -> [M, N] float32, w = (q - 8) * scale + zero per group of 32, T = ceil(N / 8) tiles of eight outputs
        (:func:`pack_int4`)
    int8_matmul(x [M, K] float32, q [N, Gp * 32] int8, scale [N] float32) -> [M, N] float32, w = q * scale per row

``Gp`` is K / 32 rounded up to a multiple of 8 (:func:`padded_groups`): int8 weights are padded with zero groups
so that the kernel scales eight groups at a time.
"""

from __future__ import annotations

import functools
import logging
import os
import pathlib

import torch

logger = logging.getLogger(__name__)


@functools.lru_cache(maxsize=None)
def native():
    """The compiled kernels' module, or None where they cannot run here (module docstring)."""
    if os.environ.get("TALON_NATIVE_KERNELS", "1") == "0":
        return None
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        return None
    try:
        from torch.utils import cpp_extension

        source = pathlib.Path(__file__).with_name("qmatmul.cpp")
        vnni = _has_vnni()
        flags = ["-O3", "-mavx2", "-mfma", "-fopenmp"] + (["-mavx512vnni", "-mavx512vl"] if vnni else [])
        return cpp_extension.load(name="talon_sd_qmatmul" + ("_vnni" if vnni else ""), sources=[str(source)],
                                  extra_cflags=flags, extra_ldflags=["-fopenmp"], verbose=False)
    except Exception as error:  # no compiler, no ninja, a failed build: torch's own kernels run instead
        logger.warning("native int4/int8 kernels unavailable (%s); using torch's", error)
        return None


def _has_vnni() -> bool:
    """Whether this CPU runs AVX512-VNNI on 256-bit vectors (``/proc/cpuinfo``: avx512_vnni and avx512vl; False
    where there is no such file). The kernels are built for the machine they run on, at first use. The int4
    kernel's integer dots then take one instruction where AVX2 takes two and an add, for the same sums (bit for
    bit): one [M, 1536] x [1536, 8960] int4 linear, 28 distinct weights, AMD EPYC with AVX512-BF16 and VNNI, 2
    threads, M = 1 / 4 / 8 / 16 / 64: 0.26 / 0.33 / 0.66 / 1.20 / 4.61 ms against AVX2's 0.26 / 0.36 / 0.72 /
    1.40 / 5.33 (2026-12-07)."""
    from ..machine import cpu_flags

    return {"avx512_vnni", "avx512vl"} <= cpu_flags()


GROUP, BLOCK = 32, 8  # inputs per group, groups the kernels scale at once


def padded_groups(in_features: int) -> int:
    """Groups of 32 of ``in_features`` inputs, rounded up to a multiple of 8."""
    return -(-in_features // GROUP // BLOCK) * BLOCK


def pad_columns(t: torch.Tensor, columns: int) -> torch.Tensor:
    """t [N, C] -> [N, columns] with zeros after column C."""
    padded = torch.zeros(t.shape[0], columns, dtype=t.dtype)
    padded[:, :t.shape[1]] = t
    return padded.contiguous()


def as_quantized(x: torch.Tensor) -> torch.Tensor:
    """x [M, K] float32 as the kernels quantize it, back in float32: per group of 32, scale = max |x| / 127 and
    q = round(x * (1 / scale)) (half to even), bit for bit as ``qmatmul.cpp`` does; times a dense copy of the
    weight it gives the kernels' products up to float32 summation order."""
    groups = x.reshape(x.shape[0], -1, GROUP)  # [M, K / 32, 32]
    scale = groups.abs().amax(dim=-1, keepdim=True) / 127  # [M, K / 32, 1]
    inverse = torch.where(scale > 0, 1 / scale, torch.zeros_like(scale))
    return (torch.round(groups * inverse).clamp(-128, 127) * scale).reshape(x.shape)


def pack_int4(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q [N, K] in 0..15, scale and zero [N, K / 32] -> the int4 kernel's ``(packed, scale, zero)``: outputs in
    tiles of eight (zeros past N); per tile and group of 32 inputs, packed holds four vectors of 32 bytes, byte
    4c + j of vector v holding output c's input 4v + j in its low nibble and 4v + 16 + j in its high one, and
    scale / zero the eight outputs' values in bfloat16."""
    out_features, in_features = q.shape
    tiles, groups = -(-out_features // 8), in_features // GROUP
    padded = torch.zeros(tiles * 8, in_features, dtype=torch.uint8)
    padded[:out_features] = q.to(torch.uint8)
    quads = padded.reshape(tiles, 8, groups, 8, 4)  # [tile, output c, group, quad, byte j]
    nibbles = quads[:, :, :, :4] | (quads[:, :, :, 4:] << 4)  # [tile, c, group, v, j]
    packed = nibbles.permute(0, 2, 3, 1, 4).reshape(tiles, groups, 128).contiguous()  # [tile, group, v, c, j]

    def per_tile(t: torch.Tensor) -> torch.Tensor:  # [N, groups] -> [tiles, groups, 8] bfloat16
        rows = torch.zeros(tiles * 8, groups, dtype=torch.bfloat16)
        rows[:out_features] = t.to(torch.bfloat16)
        return rows.reshape(tiles, 8, groups).permute(0, 2, 1).contiguous()

    return packed, per_tile(scale), per_tile(zero)
