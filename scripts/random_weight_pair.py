"""Random-weight model folders of a pair's shapes, for measuring costs where the real weights cannot go.

Costs (forward seconds by tree size, the loop's overhead) depend on a model's shapes, not its weights; acceptance
does depend on the weights (replay it: ``scripts/replay_positions.py``). Used on the lent GPU machine, whose working
tree is capped at 64 MiB (docs/BENCHMARKS.md, "Machines").

    python scripts/random_weight_pair.py CONFIGS OUT [DEVICE] [--tiny]

CONFIGS holds ``target/`` and ``draft/`` (each a model folder's config.json, generation_config.json,
chat_template.jinja and tokenizer_config.json, e.g. copied from ~/.cache/talon-sd/hf/<model>/) and one shared
``tokenizer.json``. Writes OUT/target and OUT/draft (bf16 safetensors + tokenizer), loadable as
``talon generate --target OUT/target --draft OUT/draft``. ``--tiny`` shrinks both to 2 layers of width 64 (a
smoke test of the commands on a CPU).
"""

from __future__ import annotations

import argparse
import pathlib
import shutil

import torch
from transformers import AutoConfig, AutoModelForCausalLM


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("configs", type=pathlib.Path)
    parser.add_argument("out", type=pathlib.Path)
    parser.add_argument("device", nargs="?", default="cpu")
    parser.add_argument("--tiny", action="store_true")
    args = parser.parse_args()
    for role, seed in (("target", 1), ("draft", 2)):
        config = AutoConfig.from_pretrained(args.configs / role)
        if args.tiny:
            config.num_hidden_layers, config.hidden_size, config.intermediate_size = 2, 64, 128
            config.num_attention_heads, config.num_key_value_heads = 4, 2
            config.layer_types = config.layer_types[:2]
        torch.manual_seed(seed)
        with torch.device(args.device):
            model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        folder = args.out / role
        model.save_pretrained(folder)
        for name in ("generation_config.json", "chat_template.jinja", "tokenizer_config.json"):
            shutil.copy(args.configs / role / name, folder / name)
        shutil.copy(args.configs / "tokenizer.json", folder / "tokenizer.json")
        print(f"{role}: {sum(p.numel() for p in model.parameters()) / 1e9:.2f} B parameters -> {folder}", flush=True)


if __name__ == "__main__":
    main()
