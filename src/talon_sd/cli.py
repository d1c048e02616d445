"""The ``talon`` command: ``generate``, plus ``bench``, ``sweep`` and ``tune`` from :mod:`talon_sd.bench`.

User errors print one line ``talon: error: ...`` on stderr and exit with status 2, no traceback.
"""

from __future__ import annotations

import argparse
import json
import sys

from .cli_common import (add_memory_argument, add_model_arguments, add_tree_arguments, configure_torch,
                         make_generator, restore_controller_memory, tree_options)
from .errors import TalonError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="talon", description="Lossless speculative decoding with TALON draft trees.")
    commands = parser.add_subparsers(dest="command", required=True)
    generate = commands.add_parser("generate", help="generate a completion for one prompt")
    generate.add_argument("prompt", help="the prompt (a user message for instruct models)")
    add_model_arguments(generate)
    add_tree_arguments(generate)
    generate.add_argument("--max-new-tokens", type=int, default=256)
    generate.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    generate.add_argument("--top-p", type=float, default=1.0)
    generate.add_argument("--top-k", type=int, default=0)
    generate.add_argument("--seed", type=int, default=None)
    generate.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    generate.add_argument("--no-chat-template", action="store_true", help="send the prompt as raw text")
    generate.add_argument("--json", action="store_true", help='print one JSON object {"text", "token_ids", "stats", "cpu_kernels", ...}')
    add_memory_argument(generate)
    generate.set_defaults(handler=run_generate)
    from .bench.cli import register as register_bench

    register_bench(commands)
    from .train.cli import register as register_train

    register_train(commands)
    from .serve.cli import register as register_serve

    register_serve(commands)
    return parser


def run_generate(args: argparse.Namespace) -> int:
    configure_torch(args)
    validate_generate_args(args)
    generator = make_generator(args)
    memory_key = restore_controller_memory(generator, args)
    stream = generator.stream(
        args.prompt,
        max_new_tokens=args.max_new_tokens,
        do_sample=args.temperature > 0,
        temperature=args.temperature if args.temperature > 0 else 1.0,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        stop=tuple(args.stop),
    )
    for chunk in stream:
        if not args.json:
            sys.stdout.write(chunk)
            sys.stdout.flush()
    result = stream.result
    if memory_key is not None:
        from .controller_memory import save_memory

        save_memory(generator, memory_key)
    if args.json:
        sys.stdout.write(json.dumps({**result.to_dict(), "cpu_kernels": generator.cpu_kernels}) + "\n")
    else:
        sys.stdout.write("\n")
        print(result.stats.summary(), file=sys.stderr)
    return 0


def validate_generate_args(args: argparse.Namespace) -> None:
    """Check cheap arguments before any model is loaded (a minute saved on a typo)."""
    from .config import GenerationConfig, SamplingConfig, TreeConfig

    if not args.prompt.strip():
        raise TalonError("prompt: got '', expected a non-empty string")
    GenerationConfig(max_new_tokens=args.max_new_tokens, stop=tuple(args.stop))
    if not args.temperature >= 0:
        raise TalonError(f"temperature: got {args.temperature!r}, expected a number >= 0")
    SamplingConfig(do_sample=args.temperature > 0, temperature=args.temperature, top_p=args.top_p,
                   top_k=args.top_k, seed=args.seed)
    tree_options(args, TreeConfig)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except TalonError as error:
        print(f"talon: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
