"""``agents-stream`` entry point: faust-style subcommands, each defined in its own module.

A command module exposes ``register(subparsers) -> None`` which adds its parser and sets
``func`` (called with the parsed namespace, returning the exit code).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# Modules that contribute subcommands; a missing optional one (e.g. spark) is skipped.
COMMAND_MODULES = (
    "agents_stream.cli.worker",
    "agents_stream.cli.broker",
    "agents_stream.cli.topics",
    "agents_stream.cli.acls",
    "agents_stream.cli.state",
    "agents_stream.cli.dlq",
    "agents_stream.cli.schemas",
    "agents_stream.cli.spark",
    "agents_stream.cli.ui",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agents-stream",
        description="Durable Kafka agents: run workers, an embedded broker, state and Spark tools.",
    )
    from .. import __version__

    parser.add_argument(
        "--version", action="version", version=f"agents-stream {__version__}",
        help="print the version and exit",
    )  # fmt: skip
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        # argparse takes positionals only before the first option of a subcommand:
        # `produce TOPIC -A app REC` leaves REC over; it is one of the records.
        if isinstance(getattr(args, "records", None), list) and not any(
            e.startswith("-") for e in extra
        ):
            args.records += extra
        else:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
