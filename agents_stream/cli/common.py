"""Helpers shared by command modules: loading ``-A module:app`` and common flags."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from ..app import App
from ..errors import ConfigurationError


def load_app(spec: str) -> App:
    """Import ``module:attribute`` (or ``module`` holding a single ``app``) and return it."""
    module_name, _, attr = spec.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"cannot import app module {module_name!r}: {exc}") from exc
    app = getattr(module, attr or "app", None)
    if not isinstance(app, App):
        raise ConfigurationError(f"{spec!r} is not an agents_stream.App (got {type(app).__name__})")
    return app


def add_app_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-A", "--app", required=True, help="the App to use, as module:attribute")
    parser.add_argument(
        "-b",
        "--broker",
        default=None,
        help="bootstrap servers (kafka://host:port); overrides AGENTS_STREAM_BROKER and App(broker=)",
    )
    add_log_args(parser)


def add_log_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-l",
        "--loglevel",
        default=os.environ.get("AGENTS_STREAM_LOGLEVEL", "info"),
        choices=["debug", "info", "warning", "error", "critical"],
        help="logging level (default: info)",
    )


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="[%(asctime)s] %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
