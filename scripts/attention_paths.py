"""One attention layer of the packaged target on this CPU: PyTorch's fused attention against talon_sd's grouped one.

Query rows (1 = a plain step, 16 = a tree) against a cache of L rows, the 1.5B target's heads (12 query heads and
2 key/value heads of 128), an additive mask as tree verification passes it, in bfloat16 and float32. Prints the
machine, then the median milliseconds of ``sdpa`` (``torch.nn.functional.scaled_dot_product_attention``, as
``attn_implementation="sdpa"`` calls it) and ``grouped`` (:mod:`talon_sd.attention`).

    python scripts/attention_paths.py [--threads 2] [--repeats 200] [--lengths 230,900] [--rows 1,16]
"""

from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace

import torch

from talon_sd.attention import grouped_attention_forward
from talon_sd.bench.machine import machine_info

HEADS, KV_HEADS, HEAD_DIM = 12, 2, 128


def timed(function, repeats: int) -> float:
    for _ in range(10):
        function()
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--lengths", default="230,900")
    parser.add_argument("--rows", default="1,16")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    machine = machine_info()
    print(f"machine: {machine.get('cpu')}, bf16 native: {machine.get('bf16_native')}, torch {torch.__version__}, "
          f"{args.threads} threads")
    print("| dtype | cached rows | query rows | sdpa ms | grouped ms |")
    print("|---|---|---|---|---|")
    module = SimpleNamespace(training=False)
    for dtype in (torch.bfloat16, torch.float32):
        for length in map(int, args.lengths.split(",")):
            for rows in map(int, args.rows.split(",")):
                query = torch.randn(1, HEADS, rows, HEAD_DIM).to(dtype)
                key, value = (torch.randn(1, KV_HEADS, length, HEAD_DIM).to(dtype) for _ in range(2))
                mask = torch.zeros(1, 1, rows, length, dtype=dtype)
                sdpa = timed(lambda: torch.nn.functional.scaled_dot_product_attention(
                    query, key, value, attn_mask=mask, enable_gqa=True), args.repeats)
                grouped = timed(lambda: grouped_attention_forward(module, query, key, value, mask), args.repeats)
                print(f"| {str(dtype).removeprefix('torch.')} | {length} | {rows} | {sdpa:.3f} | {grouped:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
