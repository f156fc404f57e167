"""``agents-stream ui -A module:app``: the web console over an app's journal, inputs and
dead letters (``agents_stream/console/``; needs the ``ui`` extra: aiohttp)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from typing import Any

from ..errors import AgentsStreamError
from .common import add_app_args, app_and_broker, setup_logging

log = logging.getLogger("agents_stream.console")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "ui",
        help="serve the web console (journal, PENDING calls, dead letters, lag)",
        description=(
            "Serve a local web console: the overview (agents, input partitions with the "
            "group's committed offsets and lag, dead letters per topic, the journal's "
            "counts, the workers' metrics endpoints given with --metrics), a key's history "
            "(every journaled call decoded, whether a later run replayed it, memory, outputs "
            "with their identities; search by key, call id or output identity), the PENDING "
            "calls oldest first, and the dead letters. Follows <app id>-action-state with "
            "a consumer of its own (nothing is committed). Read-only unless --allow-replay."
        ),
    )
    add_app_args(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    parser.add_argument(
        "--port", type=int, default=6066, help="port (default: 6066; 0 picks a free one)"
    )
    parser.add_argument(
        "--allow-replay",
        action="store_true",
        help="let the dead-letter page replay records to their input (default: read-only)",
    )
    parser.add_argument(
        "--metrics",
        action="append",
        default=[],
        metavar="URL",
        help="a worker's metrics endpoint (http://host:port/metrics of worker "
        "--metrics-port); repeat for each worker",
    )
    parser.add_argument(
        "--refresh",
        type=int,
        default=5,
        metavar="SECONDS",
        help="live pages reload every SECONDS (default: 5; 0: never)",
    )
    parser.set_defaults(func=run_ui)


def run_ui(args: argparse.Namespace) -> int:
    setup_logging(args.loglevel)
    try:
        from aiohttp import web
    except ImportError:
        print("error: the console needs aiohttp: pip install 'agents-stream[ui]'", file=sys.stderr)
        return 1
    from ..console.cluster import MetricsScraper
    from ..console.journal import JournalIndex, JournalTailer
    from ..console.server import Console, make_app
    from ..serde.journal import default_journal_codec

    try:
        app, bootstrap = app_and_broker(args)
        topic = app.action_state_topic
        codec = default_journal_codec(app.schema_registry_url, topic)
        # As the worker: a cluster that does not answer (or refuses the login) ends the
        # start within 10 s, rather than a console that retries forever; in one line,
        # librdkafka's own "Connect ... failed" before it kept to --loglevel debug.
        _reach(bootstrap, args.loglevel)
    except AgentsStreamError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    index = JournalIndex(codec.decode, app.id)
    tailer = JournalTailer(bootstrap, topic, index).start()
    console = Console(
        app,
        bootstrap,
        index,
        allow_replay=args.allow_replay,
        refresh=max(0, args.refresh),
        metrics=MetricsScraper(list(args.metrics)),
    )
    try:
        asyncio.run(_serve(web, make_app(console), args.host, args.port, args.allow_replay))
    finally:
        tailer.stop()
    return 0


def _reach(bootstrap: str, level: str) -> None:
    from ..kafka.admin import REACH_TIMEOUT, TopicAdmin

    rdkafka = logging.getLogger("agents_stream.librdkafka")
    kept = rdkafka.level
    if level != "debug":
        rdkafka.setLevel(logging.CRITICAL + 1)
    try:
        TopicAdmin(bootstrap, REACH_TIMEOUT).cluster_id()
    finally:
        rdkafka.setLevel(kept)


async def _serve(web: Any, application: Any, host: str, port: int, allow_replay: bool) -> None:
    """Serve until SIGTERM or SIGINT; says the address it bound (``--port 0``: a free one)."""
    runner = web.AppRunner(application, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        bound_host, bound_port = runner.addresses[0][:2]
        mode = "replay enabled" if allow_replay else "read-only"
        print(f"console on http://{bound_host}:{bound_port}/ ({mode})", file=sys.stderr, flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        await runner.cleanup()
