#!/usr/bin/env bash
# One prepared check for a lent GPU machine (docs/BENCHMARKS.md, "Machines"), in the order that matters:
#   1. the tiny-model tests on CUDA (TALON_TEST_DEVICE=cuda: losslessness of every drafter x builder, the sampling
#      test, the EAGLE-3 head, cache, edges, training), capped at TESTS_SECONDS;
#   2. the default pair's shapes with random bf16 weights (scripts/random_weight_pair.py) and an EAGLE-3 head of the
#      target's shape (random, draft vocabulary 8192 as in docs/BENCHMARKS.md, "The EAGLE-3 head"), then `talon bench` with ar, talon on the draft
#      LM and talon on the head at a fixed budget: what a draft forward and a verify cost there (acceptance needs
#      the real weights, which cannot travel: the working tree is capped at 64 MiB).
#
#     bash scripts/device_check.sh CONFIGS     # CONFIGS as scripts/random_weight_pair.py reads it
#
# Writes under $OUT (the device tool's folder; ./device_out elsewhere). The source tree runs from src/ (no install: the
# machine has no package registry), so the machine's Python needs talon-sd's dependencies but gguf (torch,
# transformers, accelerate, safetensors, tokenizers, numpy, tqdm, matplotlib) and pytest, pytest-xdist and scipy for the
# tests; the lent H200's image has them all (/work/.library/device/KINDS.md).
set -uo pipefail
CONFIGS=${1:?usage: device_check.sh CONFIGS}
OUT=${OUT:-device_out}
TESTS_SECONDS=${TESTS_SECONDS:-240}
DEVICE=${DEVICE:-cuda}  # DEVICE=cpu PAIR_OPTIONS=--tiny TESTS_SECONDS=1: a dry run of the commands on a CPU
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__,
'gpu', torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)" | tee "$OUT/versions.txt"

python3 -c "import xdist, scipy" || { echo "pytest-xdist and scipy are needed for the tests" >&2; exit 1; }
TALON_TEST_DEVICE=$DEVICE timeout -k 15 "$TESTS_SECONDS" python3 -m pytest -n 12 -q -p no:cacheprovider -p no:benchmark \
    --durations=10 tests/test_eagle3.py tests/test_cache.py tests/test_edges.py tests/test_train.py \
    tests/test_oracle.py tests/test_sampling.py >"$OUT/tests.txt" 2>&1
echo "pytest exit status $? (124: cut by the ${TESTS_SECONDS} s cap)" | tee -a "$OUT/tests.txt"
grep -E "passed|failed|error" "$OUT/tests.txt" | tail -2

PAIR=/tmp/talon-pair
python3 scripts/random_weight_pair.py "$CONFIGS" "$PAIR" "$DEVICE" ${PAIR_OPTIONS:-} || exit 1
python3 - "$PAIR" <<'EOF' || exit 1
import sys, torch
from transformers import AutoModelForCausalLM
from talon_sd.eagle3 import init_eagle3_head, save_eagle3_head
pair = sys.argv[1]
target = AutoModelForCausalLM.from_pretrained(f"{pair}/target", dtype=torch.bfloat16)
head = init_eagle3_head(target, draft_vocab=torch.arange(8192))
print(f"head: {sum(p.numel() for n, p in head.named_parameters() if not n.startswith('embed')) / 1e6:.1f} M "
      f"parameters besides the target's embedding -> {save_eagle3_head(head, f'{pair}/head')}")
EOF
python3 -m talon_sd.cli bench --target "$PAIR/target" --draft "$PAIR/draft" --head "$PAIR/head" --device "$DEVICE" \
    --dtype bfloat16 --datasets humaneval,qa --limit 2 --max-new-tokens 64 --methods ar,talon,talon@eagle3 \
    --talon-budget 16 --repeats 3 --no-progress --out "$OUT/bench" 2>&1 | tail -40
