"""Command-line pieces shared by every ``talon`` subcommand (a floor below :mod:`talon_sd.cli` and the
subcommands' own ``cli`` modules, which all import from here): model and tree flags, the generator they
describe, the controller's memory and start, torch's settings."""

from __future__ import annotations

import argparse
import os

from .config import CPU_KERNELS, QUANTIZE, TREE_METHODS
from .errors import TalonError


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags shared by every command that loads models."""
    parser.add_argument("--target", default=None, help="target model: built-in name, folder, .gguf file or hub id "
                        "(default: qwen2.5-coder-1.5b-instruct)")
    parser.add_argument("--draft", default=None, help="draft model sharing the target's vocabulary "
                        "(default: qwen2.5-coder-0.5b-instruct), or with --drafter eagle3 an EAGLE-3 head folder")
    parser.add_argument("--drafter", default="model",
                        help="model (the draft LM), ngram (prompt lookup) or eagle3 (an EAGLE-3 head, --draft DIR)")
    parser.add_argument("--dtype", default="auto", help="auto, float32 or bfloat16")
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: cuda if present)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--cpu-kernels", default="auto", choices=CPU_KERNELS,
                        help="float32 linears on CPU: packed (oneDNN), default (torch's own) or auto (whichever "
                             "serves one row faster on this CPU, or packed when it is nearly as fast on one row and "
                             "far faster on four; measured at load)")
    parser.add_argument("--quantize", default="auto", choices=QUANTIZE,
                        help="CPU linears of target and draft LM: int4 (groups of 32; a GGUF's Q4_K tensors as "
                             "stored) or int8 weight-only (the output is the quantized target's), none (as loaded), "
                             "or auto (the target as loaded; the draft LM's linears int8 where one int8 row is faster "
                             "on this CPU than in the run's dtype, measured at load)")


def add_tree_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tree", default="talon", help="one of " + ", ".join(TREE_METHODS))
    parser.add_argument("--budget", type=_int_or_auto, default=None,
                        help="N, tree nodes incl. the root, or 'auto' (default for talon/eagle/chain): an online "
                             "controller picks N every step for this machine and prompt")
    parser.add_argument("--topk", type=int, default=None, help="talon: root children K; eagle: top-k per layer")
    parser.add_argument("--mu", type=float, default=None, help="talon gate: keep p >= mu * layer max (0 < mu <= 1)")
    parser.add_argument("--depth", type=int, default=None, help="chain length; eagle draft layers")


def add_memory_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--fresh-controller", action="store_true",
                        help="start the online budget controller afresh, not from what the last run on this machine "
                             "and model pair learned (kept in the cache folder; read and written only with an auto "
                             "budget)")


def tree_options(args: argparse.Namespace, tree_config_class=None):
    """The TreeConfig the flags describe. With no ``--budget`` (and, for a chain, no ``--depth``),
    talon/eagle/chain take ``auto``: the online controller picks the budget every step."""
    from .config import AUTO, AUTO_METHODS, TreeConfig

    budget = args.budget
    if budget is None and args.tree in AUTO_METHODS and not (args.tree == "chain" and args.depth is not None):
        budget = AUTO
    options = {"budget": budget, "topk": args.topk, "mu": args.mu, "depth": args.depth}
    return TreeConfig(method=args.tree, **{k: v for k, v in options.items() if v is not None})


def controller_start(args: argparse.Namespace, tree) -> dict:
    """``initial_budget`` and ``cost_prior`` for an auto budget from this machine's ``talon tune``
    profile when one exists (the controller's starting point only); {} otherwise."""
    if not tree.auto:
        return {}
    from .bench.profiles import find_profile, profile_key
    from .control import CostPrior

    key = profile_key(args.target, args.draft, args.dtype, temperature=getattr(args, "temperature", 0.0) or 0.0,
                      quantize=getattr(args, "quantize", "none"))
    found = find_profile(key)
    if found is None:
        return {}
    profile, _ = found
    start = {}
    best = profile.get("methods", {}).get(tree.method, {}).get("best", {})
    if isinstance(best.get("budget"), int):
        start["initial_budget"] = best["budget"]
    elif tree.method == "chain" and isinstance(best.get("depth"), int):
        start["initial_budget"] = best["depth"] + 1
    curve = profile.get("cost_curve", {})
    timed = profile.get("draft_kernels")
    if (timed if timed in QUANTIZED_KERNELS else None) != _expected_draft_kernels(args):
        curve = {}  # its curves timed other kinds of linears (int8 draft forwards cost a third of float32's)
    if curve.get("verify") and curve.get("draft"):
        start["cost_prior"] = CostPrior(verify_seconds={int(k): float(v) for k, v in curve["verify"].items()},
                                        draft_seconds={int(k): float(v) for k, v in curve["draft"].items()})
    return start


QUANTIZED_KERNELS = ("int8", "int8-weights", "int4")  # talon_sd.lm.kernels_of for quantized linears


def _expected_draft_kernels(args: argparse.Namespace) -> str | None:
    """The quantized kernels ``args`` will load the draft LM with (:data:`QUANTIZED_KERNELS`), None for float
    linears: ``--quantize int4`` / ``int8``, or ``auto`` on CPU with a quantized engine, where the measured
    verdict of :func:`talon_sd.lm.choose_draft_quantization` has been int8 on every CPU seen, by 2-12x. Read before
    loading, to match a tuned profile's curves."""
    from . import models
    from .lm import draft_int8_possible

    setting = getattr(args, "quantize", "auto")
    if getattr(args, "drafter", "model") != "model":
        return None  # no draft LM
    if setting != "auto":
        return {"int4": "int4", "int8": "int8-weights"}.get(setting)
    return "int8" if draft_int8_possible(setting, models.resolve_device(args.device)) else None


def make_generator(args: argparse.Namespace):
    from .generator import SpeculativeGenerator

    configure_torch(args)
    tree = tree_options(args)
    return SpeculativeGenerator(
        args.target, args.draft, tree=tree, drafter=args.drafter, dtype=args.dtype,
        device=args.device, chat_template=not getattr(args, "no_chat_template", False), **controller_start(args, tree),
        cpu_kernels=getattr(args, "cpu_kernels", "auto"),
        quantize=getattr(args, "quantize", "auto"),
    )


def restore_controller_memory(generator, args: argparse.Namespace) -> dict | None:
    """Start ``generator``'s auto-budget calls from what the last command on this machine and model pair
    learned (:mod:`talon_sd.controller_memory`). Returns the memory key to save under at the end, or None
    (a fixed budget, or ``--fresh-controller``: nothing read, nothing written)."""
    if not generator.tree_config.auto or getattr(args, "fresh_controller", False):
        return None
    from .controller_memory import load_memory, memory_key

    key = memory_key(generator, args.target, args.draft)
    memory = load_memory(key)
    if memory is not None:
        generator.restore_controller_memory(memory)
    return key


def configure_torch(args: argparse.Namespace) -> None:
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if getattr(args, "threads", None):
        if args.threads < 1:
            raise TalonError(f"threads: got {args.threads}, expected an integer >= 1")
        torch.set_num_threads(args.threads)


def _int_or_auto(text: str):
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or 'auto', got {text!r}") from None
