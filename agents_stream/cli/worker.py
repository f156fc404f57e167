"""``agents-stream worker -A module:app``: run the App's agents on a consumer group."""

from __future__ import annotations

import argparse
import logging
import os

from ..errors import AgentsStreamError
from ..testing.broker import EmbeddedBroker
from .common import add_app_args, load_app, setup_logging

log = logging.getLogger("agents_stream.cli")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "worker",
        help="run a worker for an App",
        description=(
            "Start a worker: consume the App's input topics in its consumer group, run the "
            "agents' actions durably, write outputs. Several workers of one App share the "
            "partitions. With no broker configured (no --broker, AGENTS_STREAM_BROKER or "
            "App(broker=...)), an embedded broker is started for the worker's lifetime."
        ),
    )
    add_app_args(p)
    p.add_argument(
        "--data-dir",
        default=os.environ.get("AGENTS_STREAM_DATA_DIR"),
        help="directory of the local RocksDB caches (default: App(data_dir) or ./.agents-stream)",
    )
    p.add_argument(
        "--worker-id", default=None, help="id recorded in journal records (default host-pid)"
    )
    p.add_argument(
        "--max-in-flight",
        type=int,
        default=None,
        help="records in flight before partitions pause (default: App(max_in_flight)=6000)",
    )
    p.add_argument(
        "--shutdown-timeout",
        type=float,
        default=10.0,
        help="seconds in-flight records may finish on shutdown or rebalance (default 10)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..runtime.worker import Worker

    setup_logging(args.loglevel)
    app = load_app(args.app)
    broker = app.resolve_broker(args.broker)
    embedded = None
    if broker is None:
        embedded = EmbeddedBroker().start()
        broker = embedded.bootstrap
        log.warning("no broker configured: started an embedded broker on %s", embedded.url)
    try:
        worker = Worker(
            app,
            broker=broker,
            data_dir=args.data_dir,
            worker_id=args.worker_id,
            shutdown_timeout=args.shutdown_timeout,
            max_in_flight=args.max_in_flight,
        )
        return worker.run()
    except AgentsStreamError as exc:
        # Our own errors carry what to fix (e.g. the journal slot that is corrupt).
        log.critical("worker stopped: %s", exc, exc_info=log.isEnabledFor(logging.DEBUG))
        return 1
    finally:
        if embedded is not None:
            embedded.stop()
