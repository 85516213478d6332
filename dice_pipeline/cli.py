"""The `dice` command line. Each subcommand lives in `dice_pipeline/commands/<name>.py` and exposes
`register(subparsers)`; modules are imported lazily so `dice verify` works on a GPU host without Dagster.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> module; order is the order shown in `dice --help`.
SUBCOMMANDS = {
    "run": "dice_pipeline.commands.run",
    "dev": "dice_pipeline.commands.dev",
    "verify": "dice_pipeline.commands.verify",
    "generate": "dice_pipeline.commands.generate",
    "synthesize": "dice_pipeline.commands.synthesize",
    "eval": "dice_pipeline.commands.eval",
    "export-training-data": "dice_pipeline.commands.export_training_data",
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dice", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module_name in SUBCOMMANDS.items():
        if only is not None and name != only:
            # Keep the name visible in --help without importing its module (and its dependencies).
            sub.add_parser(name, help=f"see `dice {name} --help`", add_help=False)
            continue
        importlib.import_module(module_name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    chosen = argv[0] if argv and argv[0] in SUBCOMMANDS else None
    args = build_parser(only=chosen).parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
