"""Container healthcheck of a worker: the broker in AGENTS_STREAM_BROKER answers a
metadata request within 5 seconds. (The worker has no HTTP endpoint; a dead worker
process ends the container, so liveness needs no check of its own.) Exit 0 = healthy."""

import os
import sys

from confluent_kafka.admin import AdminClient

from agents_stream.app import normalize_broker
from agents_stream.kafka.config import admin_config, configure

url = os.environ.get("AGENTS_STREAM_BROKER")
if not url:
    sys.exit("AGENTS_STREAM_BROKER is not set")
# Connects like the worker: AGENTS_STREAM_KAFKA_CONFIG and AGENTS_STREAM_KAFKA_* (SASL/TLS).
configure()
try:
    conf = {**admin_config(normalize_broker(url)), "log_level": 0}
    AdminClient(conf).list_topics(timeout=5)
except Exception as exc:
    sys.exit(f"broker {url} unreachable: {exc}")
