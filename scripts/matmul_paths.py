"""Small-M matmul and attention paths on this CPU: what a verify of a few tokens costs against one token.

One linear of the packaged target's MLP ([M, 1536] x [1536, 8960]) timed for M = 1, 2, 4, 8, 16 through
the paths torch offers on a CPU without extra packages:

* ``fp32``           nn.Linear in float32 (MKL / oneDNN sgemm, as torch dispatches it)
* ``bf16``           nn.Linear with bfloat16 weights and inputs
* ``fp32-mkldnn``    the weight packed for oneDNN (torch.utils.mkldnn.to_mkldnn)
* ``int8-dynamic``   torch.ao dynamic quantization (int8 weights, fbgemm / onednn kernels)
* ``int4-kernel``    the kernel of ``--quantize int4`` (talon_sd.quantize, int4 groups of 32, bfloat16 inputs)
* ``int8-kernel``    the kernel of ``--quantize int8`` (int8 per output channel, bfloat16 inputs)
* ``int4-native``, ``int8-native``  the same weights through talon_sd.kernels (float32 inputs, int8 per group of
                     32 inside): what ``--quantize int4`` / ``int8`` run in a float32 model

Prints the machine, then per path the median milliseconds, the ratio of M = 2 to M = 1, and how far its
output is from float32 (the effect on output identity: anything but fp32 and fp32-mkldnn changes the logits
visibly, so greedy output may differ from float32 plain decoding at near-ties).

With ``--copies C`` (C > 1) every timed call runs the rows through C linears of distinct random weights in turn
and reports the time per linear: a model's layers are read from memory each step, while one weight timed again
and again stays in the CPU's cache (13.8 MB as int8), which flatters the small types (28 copies: one per layer of
the packaged target).

Then one attention layer of the target (12 query and 2 key/value heads of 128, an additive mask as tree
verification passes it) for ``--rows`` query rows against ``--lengths`` cached rows, bfloat16 and float32:
``sdpa`` (``scaled_dot_product_attention``, as ``attn_implementation="sdpa"`` calls it) against ``grouped``
(talon_sd.attention, the CPU default).

    python scripts/matmul_paths.py [--threads 2] [--repeats 30] [--sizes 1,2,4,8,16] [--copies 1] [--lengths 230,900] [--rows 1,16]
"""

from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace

import torch

from talon_sd.attention import grouped_attention_forward
from talon_sd.kernels import native
from talon_sd.quantize import Int4Linear, Int8Linear, int4_from_float, int8_from_float

HEADS, KV_HEADS, HEAD_DIM = 12, 2, 128  # the packaged target's attention


def timed(function, repeats: int) -> float:
    for _ in range(3):
        function()
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples) * 1000


def paths(linear: torch.nn.Linear) -> dict:
    made = {"fp32": (linear, torch.float32), "bf16": (torch.nn.Linear(1536, 8960, bias=False).to(torch.bfloat16), torch.bfloat16)}
    made["bf16"][0].weight.data.copy_(linear.weight.data.to(torch.bfloat16))
    try:
        from torch.utils import mkldnn

        made["fp32-mkldnn"] = (mkldnn.to_mkldnn(torch.nn.Sequential(linear)), torch.float32)
    except Exception as error:  # builds without oneDNN
        print(f"fp32-mkldnn unavailable: {error}")
    try:
        quantized = torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(linear), {torch.nn.Linear}, dtype=torch.qint8)
        made["int8-dynamic"] = (quantized, torch.float32)
    except Exception as error:
        print(f"int8-dynamic unavailable: {error}")
    try:  # the kernels alone: their linears run more than QUANTIZED_ROWS rows through a dense copy
        int4 = Int4Linear(int4_from_float(linear.weight), None)
        int8 = Int8Linear(*int8_from_float(linear.weight), None)
        made["int4-kernel"] = (int4._rows_times_weight, torch.bfloat16)
        made["int8-kernel"] = (int8._rows_times_weight, torch.bfloat16)
    except Exception as error:  # builds without those CPU kernels
        print(f"int4/int8 kernels unavailable: {error}")
    if native() is not None:
        made["int4-native"] = (Int4Linear(int4_from_float(linear.weight), None, torch.float32)._rows_times_weight,
                               torch.float32)
        made["int8-native"] = (Int8Linear(*int8_from_float(linear.weight), None, torch.float32)._rows_times_weight,
                               torch.float32)
    return made


def attention_table(lengths: list[int], rows_list: list[int], repeats: int) -> None:
    """Median milliseconds of one attention layer, sdpa against grouped, by dtype, cached rows and query rows."""
    print(f"{'attention':<14}{'cached':>8}{'rows':>6}{'sdpa':>10}{'grouped':>10}")
    module = SimpleNamespace(training=False)
    for dtype in (torch.bfloat16, torch.float32):
        for length in lengths:
            for rows in rows_list:
                query = torch.randn(1, HEADS, rows, HEAD_DIM).to(dtype)
                key, value = (torch.randn(1, KV_HEADS, length, HEAD_DIM).to(dtype) for _ in range(2))
                mask = torch.zeros(1, 1, rows, length, dtype=dtype)
                sdpa = timed(lambda: torch.nn.functional.scaled_dot_product_attention(
                    query, key, value, attn_mask=mask, enable_gqa=True), repeats)
                grouped = timed(lambda: grouped_attention_forward(module, query, key, value, mask), repeats)
                print(f"{str(dtype).removeprefix('torch.'):<14}{length:>8}{rows:>6}{sdpa:>10.3f}{grouped:>10.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--sizes", default="1,2,4,8,16")
    parser.add_argument("--copies", type=int, default=1, help="linears of distinct weights per timed call (docstring)")
    parser.add_argument("--lengths", default="230,900", help="cached rows of the attention table")
    parser.add_argument("--rows", default="1,16", help="query rows of the attention table")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from talon_sd.bench.machine import cpu_model

    flags = open("/proc/cpuinfo").read()
    kind = "AVX512-BF16" if "avx512_bf16" in flags else ("AVX512" if "avx512f" in flags else "AVX2")
    kind += ", AMX" if "amx_bf16" in flags else ""
    print(f"machine: {cpu_model()} ({kind}), torch {torch.__version__}, {args.threads} threads, "
          f"{args.copies} weight cop{'y' if args.copies == 1 else 'ies'} per path")
    torch.manual_seed(0)
    linear = torch.nn.Linear(1536, 8960, bias=False)
    if args.copies < 1:
        parser.error(f"--copies: got {args.copies}, expected an integer >= 1")
    others = [paths(torch.nn.Linear(1536, 8960, bias=False)) for _ in range(args.copies - 1)]  # distinct weights
    sizes = [int(s) for s in args.sizes.split(",")]
    reference = {m: linear(torch.randn(m, 1536, generator=torch.Generator().manual_seed(m))) for m in sizes}
    print(f"{'path':<14}" + "".join(f"{'M=' + str(m):>10}" for m in sizes) + "   ratio M=2/M=1   max |y - y_fp32| / max |y|")
    with torch.inference_mode():
        for name, (module, dtype) in paths(linear).items():
            times, error = [], 0.0
            for m in sizes:
                x = torch.randn(m, 1536, generator=torch.Generator().manual_seed(m)).to(dtype)
                modules = [module] + [made[name][0] for made in others]
                times.append(timed(lambda: [each(x) for each in modules], args.repeats) / len(modules))
                y = module(x).float()
                error = max(error, float((y - reference[m]).abs().max() / reference[m].abs().max()))
            ratio = times[1] / times[0] if len(times) > 1 else float("nan")
            print(f"{name:<14}" + "".join(f"{t:>10.2f}" for t in times) + f"   {ratio:>13.2f}   {error:.2e}")
        attention_table([int(n) for n in args.lengths.split(",")], [int(n) for n in args.rows.split(",")],
                        args.repeats)


if __name__ == "__main__":
    main()
