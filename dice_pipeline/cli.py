"""The `dice` command line: build the curated CUDA-kernel dataset (`dice run`, `dice dev` for the UI), judge kernels,
generate, synthesize, evaluate on KernelBench and export training data.

Each subcommand lives in `dice_pipeline/commands/<name>.py` and exposes `register(subparsers)`; modules are imported
lazily so `dice verify` works on a GPU host without Dagster.
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
EXIT_USAGE, EXIT_INTERRUPTED = 2, 130


def summary(doc: str | None) -> str:
    """A module docstring's first paragraph as one line: a help text that ends where its sentence does."""
    return " ".join((doc or "").strip().split("\n\n")[0].split())


def details(doc: str | None) -> str:
    """A module docstring after its first paragraph (an epilog for --help)."""
    parts = (doc or "").strip().split("\n\n", 1)
    return parts[1] if len(parts) > 1 else ""


class DiceArgumentParser(argparse.ArgumentParser):
    """argparse, with a mistake on the command line said in one line (and exit 2) instead of the usage block."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = DiceArgumentParser(prog="dice", description=summary(__doc__))
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
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        # Ctrl-C is the user's choice, not a crash: one line, no traceback (what was finished is kept).
        print(f"dice {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
