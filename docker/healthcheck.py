"""Container healthcheck of a worker: the broker in AGENTS_STREAM_BROKER answers a
metadata request within 5 seconds. (The worker has no HTTP endpoint; a dead worker
process ends the container, so liveness needs no check of its own.) Exit 0 = healthy."""

import os
import sys

from confluent_kafka.admin import AdminClient

from agents_stream.app import normalize_broker

url = os.environ.get("AGENTS_STREAM_BROKER")
if not url:
    sys.exit("AGENTS_STREAM_BROKER is not set")
try:
    AdminClient({"bootstrap.servers": normalize_broker(url), "log_level": 0}).list_topics(timeout=5)
except Exception as exc:
    sys.exit(f"broker {url} unreachable: {exc}")
