"""Helpers shared by command modules: loading ``-A module:app`` and common flags."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from ..app import App
from ..errors import ConfigurationError
from ..kafka.config import CONFIG_FILE_ENV, configure
from ..serde.registry import REGISTRY_ENV, resolve_registry_url


def load_app(spec: str) -> App:
    """Import ``module:attribute`` (or ``module`` holding a single ``app``) and return it."""
    module_name, _, attr = spec.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise ConfigurationError(
                f"cannot import app module {module_name!r} (no module {exc.name!r}): fix -A "
                f"module:attribute, run from the directory that contains it, or set PYTHONPATH"
            ) from exc
        raise ConfigurationError(
            f"app module {module_name!r} failed to import: {exc}; install the missing package"
        ) from exc
    except Exception as exc:
        # The user's module is broken: one line here, the traceback with --loglevel debug.
        raise ConfigurationError(
            f"app module {module_name!r} failed to import: {type(exc).__name__}: {exc}; "
            f"fix the module (python -c 'import {module_name}' shows the traceback)"
        ) from exc
    name = attr or "app"
    app = getattr(module, name, None)
    if not isinstance(app, App):
        apps = sorted(k for k, v in vars(module).items() if isinstance(v, App))
        found = f"its Apps: {', '.join(apps)}" if apps else "it defines no App"
        problem = "has no attribute" if app is None else "is not an agents_stream.App:"
        raise ConfigurationError(
            f"module {module_name!r} {problem} {name!r} ({found}): fix -A module:attribute"
        )
    return app


def app_and_broker(args: argparse.Namespace) -> tuple[App, str]:
    """The app of ``-A`` with its clients configured, and the broker it resolves
    (``--broker``, ``$AGENTS_STREAM_BROKER``, ``App(broker=)``); ConfigurationError when
    none is configured."""
    app = load_app(args.app)
    configure_clients(app, args)
    bootstrap = app.resolve_broker(args.broker)
    if not bootstrap:
        raise ConfigurationError(
            "no broker configured: pass --broker, set AGENTS_STREAM_BROKER or App(broker=)"
        )
    return app, bootstrap


# The help of each option every command shares, said once (issue 67: -A and -b read
# differently from one command to the next).
APP_HELP = "the App to use, as module:attribute (module alone: its `app`)"
BROKER_HELP = (
    "bootstrap servers (kafka://host:port[,host:port]); overrides AGENTS_STREAM_BROKER and "
    "App(broker=)"
)
KAFKA_CONFIG_HELP = (
    "librdkafka properties file (key=value lines) applied to every Kafka client, over "
    "App(kafka_config); AGENTS_STREAM_KAFKA_<PROPERTY> variables override it "
    f"(default: ${CONFIG_FILE_ENV})"
)
REGISTRY_HELP = (
    f"Schema Registry URL (Confluent API); overrides ${REGISTRY_ENV} and "
    "App(schema_registry_url=); client settings are schema.registry.* keys of "
    "--kafka-config / AGENTS_STREAM_KAFKA_SCHEMA_REGISTRY_*"
)
LOGLEVEL_HELP = "logging level (default: info, or $AGENTS_STREAM_LOGLEVEL)"


def add_app_arg(parser: argparse.ArgumentParser, *, required: bool = True) -> None:
    parser.add_argument("-A", "--app", required=required, default=None, help=APP_HELP)


def add_app_args(parser: argparse.ArgumentParser, *, app_required: bool = True) -> None:
    """-A, -b, --kafka-config, --schema-registry and -l, as every command takes them."""
    add_app_arg(parser, required=app_required)
    parser.add_argument("-b", "--broker", default=None, help=BROKER_HELP)
    parser.add_argument(
        "--kafka-config",
        metavar="PATH",
        default=os.environ.get(CONFIG_FILE_ENV),
        help=KAFKA_CONFIG_HELP,
    )
    add_registry_arg(parser)
    add_log_args(parser)


def add_registry_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--schema-registry",
        metavar="URL",
        default=None,
        help=REGISTRY_HELP,
    )


def configure_clients(app: App, args: argparse.Namespace) -> None:
    """Install the common Kafka client configuration of ``app`` and ``--kafka-config``,
    and the registry of ``--schema-registry`` / ``$AGENTS_STREAM_SCHEMA_REGISTRY``."""
    configure(app.kafka_config, getattr(args, "kafka_config", None))
    apply_registry(app, args)


def apply_registry(app: App, args: argparse.Namespace) -> None:
    """``app.schema_registry_url`` as this command resolves it (every codec, job and host
    reads it there)."""
    app.schema_registry_url = resolve_registry_url(
        getattr(args, "schema_registry", None), app.schema_registry_url
    )


def add_log_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-l",
        "--loglevel",
        default=os.environ.get("AGENTS_STREAM_LOGLEVEL", "info"),
        choices=["debug", "info", "warning", "error", "critical"],
        help=LOGLEVEL_HELP,
    )


def setup_logging(level: str, *, tool: bool = False) -> None:
    """Log lines to stderr at ``level``. A ``tool`` (a one-shot command: state, dlq,
    produce, tail, spark) keeps librdkafka's own lines to ``--loglevel debug``: it says
    what failed itself, in one line, and librdkafka's "Connect to ... failed" before it
    would make two."""
    if tool:
        quiet = logging.DEBUG if level.lower() == "debug" else logging.CRITICAL + 1
        logging.getLogger("agents_stream.librdkafka").setLevel(quiet)
    # A worker started by ``worker --processes N`` says which of them it is.
    index = os.environ.get("AGENTS_STREAM_PROCESS_INDEX")
    where = f" process-{index}" if index else ""
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format=f"[%(asctime)s]{where} %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def positive_int(text: str) -> int:
    """argparse type of counts that must be at least 1 (threads, concurrency)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return value
