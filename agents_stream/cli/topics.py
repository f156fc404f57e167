"""``agents-stream produce`` and ``agents-stream tail``: put records on a topic and watch
what comes out, with the worker's client configuration.

A newcomer's loop is "send an input, see the output" without writing a Kafka client;
an operator's is "what is on this topic right now, with which identity headers". Both
commands read with ``assign()`` (no consumer group: no join wait, nothing committed) and
take the same broker and client settings as the worker (``--broker``,
``AGENTS_STREAM_BROKER``, ``--kafka-config``, ``AGENTS_STREAM_KAFKA_*``, and with ``-A``
the App's). With ``-A`` values go through the App's codec of that topic (Avro when the
agent binding has a schema), else they are JSON text.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
)
from confluent_kafka import TopicPartition as TP

from ..app import BROKER_ENV, App, normalize_broker
from ..errors import AgentsStreamError, ConfigurationError
from ..kafka.admin import AUTHORIZATION_ERRORS, denied, refusal
from ..kafka.config import CONFIG_FILE_ENV, configure, producer_config, reader_config, scrub
from ..kafka.ends import read_ends
from ..serde.registry import resolve_registry_url
from ..serde.values import JsonValueCodec, RegistryValueReader, value_codec
from .common import add_app_args, apply_registry, load_app, setup_logging
from .topic_errors import CLIENT_MAX_BYTES, missing, produce_refusal, read_refusal, too_large

log = logging.getLogger("agents_stream.cli")

EPILOG = f"""\
broker: --broker, else ${BROKER_ENV}, else App(broker=) of -A.
client settings: -A's App(kafka_config), then --kafka-config (default ${CONFIG_FILE_ENV}),
then AGENTS_STREAM_KAFKA_<PROPERTY> variables (AGENTS_STREAM_KAFKA_SASL_PASSWORD ->
sasl.password), as for the worker.
schema registry (Avro values of -A's agents): --schema-registry, else
$AGENTS_STREAM_SCHEMA_REGISTRY, else App(schema_registry_url=); registry-framed values
are decoded by the writer schema their id names.
"""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "produce",
        help="send records to a topic (JSON, or the App's codec with -A)",
        description=(
            "Send records to TOPIC. A record is JSON text, or KEY=JSON to give it a key "
            "(the text before the first '=' is the key when it does not start with { [ or "
            '"). Records come from the RECORD arguments, else from --file, else from '
            "stdin, one per line (blank lines and lines starting with # are skipped); with "
            "--raw, values are bytes as given. Waits up to 10 s (or a shorter --timeout) for the topic to exist (a worker "
            "creates its topics when it starts) and up to --timeout for every record to be "
            "acknowledged."
        ),
        epilog=EPILOG
        + "\nexamples:\n"
        + '  agents-stream produce tickets \'u-1={"text": "refund please"}\'\n'
        + '  agents-stream produce tickets --key u-2 \'{"text": "hello"}\'\n'
        + "  agents-stream produce orders -A examples.payments:app --file orders.jsonl\n"
        + "  agents-stream produce orders --raw --key o-9 --file garbage.bin\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("topic", help="topic to write to")
    p.add_argument("records", nargs="*", metavar="RECORD", help="JSON, or KEY=JSON")
    p.add_argument("-k", "--key", default=None, help="key of records that give none")
    p.add_argument(
        "-f", "--file", default=None, metavar="PATH", help="records, one per line ('-': stdin)"
    )
    p.add_argument("-p", "--partition", type=int, default=None, help="partition (default: by key)")
    p.add_argument(
        "--raw",
        action="store_true",
        help="values are bytes as given, through no codec and no KEY= parsing (key: --key): "
        "each RECORD argument is one value, else --file's (or stdin's) whole content is "
        "one; e.g. a value no codec reads, to try the dead-letter path",
    )
    p.add_argument(
        "-H",
        "--header",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a header for every record (repeatable)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="how long to wait for every record to be acknowledged (default: 30); the wait "
        "for the topic to exist is the shorter of this and 10 s",
    )
    add_app_args(p, app_required=False)
    p.set_defaults(func=run_produce)

    t = sub.add_parser(
        "tail",
        help="print a topic's records: partition, offset, key, value, headers",
        description=(
            "Print TOPIC's records as they arrive, one line each: topic[partition]@offset, "
            "key, value (decoded with the App's codec with -A, else JSON or text) and "
            "headers (an output's x-agents-stream-output header is its identity). Reads "
            "every partition without a consumer group and commits nothing. Reads committed "
            "records only (isolation.level=read_committed): what an exactly-once worker "
            "wrote in a transaction shows once it commits, never if it aborts. Runs until "
            "interrupted, --max records, or --timeout seconds."
        ),
        epilog=EPILOG
        + "\nexamples:\n"
        + "  agents-stream tail triaged --max 2 --timeout 60\n"
        + "  agents-stream tail receipts -A examples.payments:app --from end --json\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    t.add_argument("topic", help="topic to read")
    t.add_argument(
        "--from",
        dest="start",
        choices=["beginning", "end"],
        default="beginning",
        help="start at the beginning of each partition (default) or at its end",
    )
    t.add_argument("-n", "--max", type=int, default=None, help="stop after this many records")
    t.add_argument("--partition", type=int, default=None, help="only this partition")
    t.add_argument("--json", action="store_true", help="one JSON object per record")
    t.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="stop after this long, exiting 1 if --max records were not read by then "
        "(default: run until interrupted); also bounds the wait for the topic to exist "
        "(default: 10)",
    )
    add_app_args(t, app_required=False)
    t.set_defaults(func=run_tail)


# -- shared ----------------------------------------------------------------------------
def _setup(args: argparse.Namespace) -> tuple[str, App | None]:
    setup_logging(args.loglevel, tool=True)
    app = load_app(args.app) if args.app else None
    configure(app.kafka_config if app else None, args.kafka_config)
    if app is not None:
        apply_registry(app, args)
    url = args.broker or os.environ.get(BROKER_ENV) or (app.broker if app else None)
    if not url:
        raise ConfigurationError(
            f"no broker: pass --broker kafka://host:port, set {BROKER_ENV}, or -A an App "
            "with broker="
        )
    return normalize_broker(url), app


def _codec(app: App | None, topic: str, registry: str | None = None) -> Any:
    """The App's codec of ``topic`` (an agent's input or output schema), else JSON (and,
    with a registry, registry-framed values of any schema)."""
    if app is not None:
        for b in app.agents:
            schema = b.input_schema if b.input == topic else None
            if b.output == topic:
                schema = b.output_schema
            if schema is not None:
                return value_codec(
                    schema,
                    registry_url=app.schema_registry_url,
                    topic=topic,
                    strategy=app.subject_name_strategy,
                )
    url = app.schema_registry_url if app is not None else registry
    return RegistryValueReader(url) if url else JsonValueCodec()


def _client(kind: type[Any], conf: dict[str, Any]) -> Any:
    """A librdkafka client; a property it rejects is one line, not a traceback."""
    try:
        return kind(conf)
    except KafkaException as exc:
        raise ConfigurationError(
            f"Kafka client configuration rejected: {scrub(exc.args[0].str())}; fix "
            "--kafka-config, AGENTS_STREAM_KAFKA_* or App(kafka_config)"
        ) from exc


# How long produce and tail wait for a missing topic: a worker creates its topics within
# a few seconds of its start, and a typo must not look like a hang (the CLI's start-up
# budget, as the worker's).
TOPIC_WAIT = 10.0


def _partitions(bootstrap: str, topic: str, wait: float, need: str) -> list[int]:
    """The topic's partitions, waiting up to ``wait`` s for it to exist (a worker creates
    its topics as it starts). A refusal (login, TLS, ACL) ends the wait at once; ``need``
    is the ACL operation the command needs beside Describe (Write, Read)."""
    refused: list[str] = []

    def on_error(err: KafkaError) -> None:
        said = refusal(err, bootstrap)
        if said is not None:
            refused.append(said)

    probe = _client(Consumer, reader_config(bootstrap, {"error_cb": on_error}))
    deadline = time.monotonic() + wait
    try:
        while True:
            try:
                md = probe.list_topics(topic, timeout=min(5.0, max(wait, 0.5)))
            except KafkaException as exc:
                probe.poll(0)  # serves error_cb: a refused login or certificate says why
                raise ConfigurationError(
                    refused[0]
                    if refused
                    else f"cannot reach the Kafka cluster at {bootstrap} "
                    f"({scrub(exc.args[0].str())}): check --broker / {BROKER_ENV}"
                ) from exc
            found = md.topics.get(topic)
            if found is not None and found.error is None and found.partitions:
                return sorted(found.partitions)
            err = found.error if found is not None else None
            if err is not None and err.code() in AUTHORIZATION_ERRORS:  # waiting cannot help
                raise ConfigurationError(
                    denied(
                        f"describing topic {topic} ({scrub(err.str())})",
                        f"Describe and {need} on topic {topic}",
                    )
                )
            if time.monotonic() >= deadline:
                raise ConfigurationError(missing(topic, bootstrap, f"waited {wait:g}s"))
            time.sleep(0.2)
    finally:
        probe.close()


# -- produce ---------------------------------------------------------------------------
def parse_record(text: str, default_key: str | None) -> tuple[str | None, Any]:
    """``JSON`` or ``KEY=JSON`` -> (key, value); ValueError with the reason."""
    head, sep, rest = text.partition("=")
    key: str | None
    if sep and head and head[0] not in '{["' and not head.strip().lstrip("-").isdigit():
        key, body = head, rest
    else:
        key, body = default_key, text
    try:
        return key, json.loads(body)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg} at column {exc.colno}): {body[:60]!r}") from None


def _lines(args: argparse.Namespace) -> Iterator[tuple[str, str]]:
    """(where, text) of every record given."""
    if args.records:
        for n, text in enumerate(args.records, 1):
            yield f"argument {n}", text
        return
    if args.file in (None, "-"):
        if args.file is None and sys.stdin.isatty():
            raise ConfigurationError("no records: give RECORD arguments, --file PATH or stdin")
        source: Iterable[str] = sys.stdin
        name = "stdin"
    else:
        try:
            source = open(args.file, encoding="utf-8")  # noqa: SIM115 - read to the end below
        except OSError as exc:
            raise ConfigurationError(f"cannot read --file {args.file}: {exc.strerror}") from exc
        name = args.file
    for n, line in enumerate(source, 1):
        text = line.strip()
        if text and not text.startswith("#"):
            yield f"{name} line {n}", text


def _raw_values(args: argparse.Namespace) -> list[bytes]:
    """``--raw``: each RECORD argument's bytes (as the shell passed them), else the whole
    of --file or stdin as one value."""
    if args.records:
        # surrogateescape: argv bytes that are not UTF-8 go out as they came in
        return [text.encode("utf-8", "surrogateescape") for text in args.records]
    if args.file in (None, "-"):
        if args.file is None and sys.stdin.isatty():
            raise ConfigurationError("no value: give RECORD arguments, --file PATH or stdin")
        return [sys.stdin.buffer.read()]
    try:
        with open(args.file, "rb") as source:
            return [source.read()]
    except OSError as exc:
        raise ConfigurationError(f"cannot read --file {args.file}: {exc.strerror}") from exc


def run_produce(args: argparse.Namespace) -> int:
    try:
        bootstrap, app = _setup(args)
        codec = _codec(app, args.topic, resolve_registry_url(args.schema_registry))
        headers = [_header(h) for h in args.header]
        records = []
        if args.raw:
            records = [(args.key, value) for value in _raw_values(args)]
        for where, text in () if args.raw else _lines(args):
            try:
                key, value = parse_record(text, args.key)
                records.append((key, codec.encode(value)))
            except (ValueError, AgentsStreamError) as exc:
                raise ConfigurationError(f"{where}: {exc}") from None
        partitions = _partitions(bootstrap, args.topic, min(TOPIC_WAIT, args.timeout), "Write")
        if args.partition is not None and args.partition not in partitions:
            raise ConfigurationError(
                f"--partition {args.partition}: {args.topic} has partitions 0-{len(partitions) - 1}"
            )
        sent = _send(bootstrap, args.topic, records, args.partition, headers, args.timeout)
    except AgentsStreamError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(landed_text(args.topic, sent), flush=True)
    return 0


def landed_text(topic: str, landed: list[tuple[int, int]]) -> str:
    """Where records landed, as offset ranges per partition: ``produced 1 record to t:
    partition 3 offset 0``; with several partitions one line each (200 offsets on one
    line are unreadable)."""
    by_partition: dict[int, list[int]] = {}
    for partition, offset in landed:
        by_partition.setdefault(partition, []).append(offset)
    rows = []
    for partition in sorted(by_partition):
        offsets = sorted(by_partition[partition])
        spans, start = [], offsets[0]
        for prev, cur in zip(offsets, [*offsets[1:], None], strict=True):
            if cur != prev + 1:
                spans.append(f"{start}" if start == prev else f"{start}-{prev}")
                start = cur if cur is not None else start
        word = "offset" if len(offsets) == 1 else "offsets"
        rows.append(f"partition {partition} {word} {', '.join(spans)}")
    head = f"produced {len(landed)} record{'s' if len(landed) != 1 else ''} to {topic}"
    if len(rows) == 1:
        return f"{head}: {rows[0]}"
    return f"{head}:\n" + "\n".join(f"  {row}" for row in rows)


def _header(text: str) -> tuple[str, bytes]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise ConfigurationError(f"--header {text!r}: expected NAME=VALUE")
    # surrogateescape: argv bytes that are not UTF-8 go out as they came in
    return name, value.encode("utf-8", "surrogateescape")


def _send(
    bootstrap: str,
    topic: str,
    records: list[tuple[str | None, bytes]],
    partition: int | None,
    headers: list[tuple[str, bytes]],
    timeout: float,
) -> list[tuple[int, int]]:
    """Send every record, wait for the acks; (partition, offset) of each. The first
    refusal, the client's (over its message.max.bytes) or the cluster's, is one line."""
    conf = producer_config(bootstrap)
    conf.pop("enable.idempotence", None)  # a tool: plain acks=all is enough
    conf["message.timeout.ms"] = max(1000, int(timeout * 1000))
    producer = _client(Producer, conf)
    landed: list[tuple[int, int]] = []
    failed: list[str] = []

    def report(err: Any, msg: Any) -> None:
        if err is not None:
            size = len(msg.value()) if msg.value() is not None else None
            failed.append(produce_refusal(err, topic, bootstrap, size))
        else:
            landed.append((msg.partition(), msg.offset()))

    for key, value in records:
        extra: dict[str, Any] = {"partition": partition} if partition is not None else {}
        try:
            producer.produce(
                topic,
                value,
                key=key.encode() if key is not None else None,
                headers=headers or None,
                on_delivery=report,
                **extra,
            )
        except KafkaException as exc:  # refused by the client before any broker saw it
            err = exc.args[0]
            if err.code() == KafkaError.MSG_SIZE_TOO_LARGE:
                limit = int(conf.get("message.max.bytes", CLIENT_MAX_BYTES))
                said = f"refused by the producer: its message.max.bytes is {limit:,}"
                raise ConfigurationError(too_large(topic, len(value), said)) from exc
            raise ConfigurationError(produce_refusal(err, topic, bootstrap, len(value))) from exc
        producer.poll(0)
    producer.flush(timeout)
    if failed or len(landed) < len(records):
        sent = f"{len(landed)} of {len(records)} record(s) acknowledged"
        raise ConfigurationError(
            f"{failed[0]} ({sent})"
            if failed
            else f"{sent} by {bootstrap} within {timeout:g}s: check that the cluster is up, "
            "or raise --timeout"
        )
    return landed


# -- tail ------------------------------------------------------------------------------
def run_tail(args: argparse.Namespace) -> int:
    try:
        bootstrap, app = _setup(args)
        codec = _codec(app, args.topic, resolve_registry_url(args.schema_registry))
        wait = TOPIC_WAIT if args.timeout is None else min(TOPIC_WAIT, args.timeout)
        partitions = _partitions(bootstrap, args.topic, wait, "Read")
        if args.partition is not None:
            if args.partition not in partitions:
                raise ConfigurationError(
                    f"--partition {args.partition}: {args.topic} has partitions "
                    f"0-{len(partitions) - 1}"
                )
            partitions = [args.partition]
        refused: list[str] = []
        consumer = _client(
            Consumer,
            reader_config(
                bootstrap,
                {"error_cb": lambda err: refused.extend(filter(None, [refusal(err, bootstrap)]))},
            ),
        )
        starts = _starts(consumer, args.topic, partitions, args.start, bootstrap)
    except AgentsStreamError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    # Said because a record missing from an open transaction would otherwise look lost.
    log.info(
        "reading %s %s from the %s, committed records only (isolation.level=read_committed)",
        args.topic,
        _spans(partitions),
        args.start,
    )
    consumer.assign([TP(args.topic, p, starts[p]) for p in partitions])
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    seen = 0
    try:
        while args.max is None or seen < args.max:
            if deadline is not None and time.monotonic() >= deadline:
                break
            msg = consumer.poll(0.2)
            if refused:  # a login or certificate refused after the topic was found
                print(f"error: {refused[0]}", file=sys.stderr)
                return 1
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                final = read_refusal(err, args.topic, bootstrap)
                if final is not None:
                    print(f"error: {final}", file=sys.stderr)
                    return 1
                if err.code() != KafkaError._PARTITION_EOF:  # transient: librdkafka retries
                    log.warning("%s: %s (retrying)", args.topic, scrub(err.str()))
                continue
            print(_render(msg, codec, as_json=args.json), flush=True)
            seen += 1
    except KeyboardInterrupt:
        pass
    finally:
        consumer.close()
    if args.max is not None and seen < args.max:
        print(f"tail: {seen} of {args.max} record(s) before the timeout", file=sys.stderr)
        return 1
    return 0


def _starts(
    consumer: Any, topic: str, partitions: list[int], start: str, bootstrap: str
) -> dict[int, int]:
    """Where tail reads each partition from: its beginning, or its end as this consumer
    reads it (kafka/ends.py), never ListOffsets' end alone: the embedded broker's is
    short after a batched produce, and old records came out as new."""
    if start == "beginning":
        return dict.fromkeys(partitions, OFFSET_BEGINNING)
    try:
        ends = read_ends(consumer, [(topic, p) for p in partitions], timeout=TOPIC_WAIT)
    except KafkaException as exc:
        final = read_refusal(exc.args[0], topic, bootstrap)
        raise ConfigurationError(final or f"cannot find the end of {topic}: {exc}") from exc
    return {p: ends[(topic, p)] for p in partitions}


def _spans(partitions: list[int]) -> str:
    if partitions == list(range(partitions[0], partitions[-1] + 1)) and len(partitions) > 1:
        return f"partitions {partitions[0]}-{partitions[-1]}"
    return ("partition " if len(partitions) == 1 else "partitions ") + ", ".join(
        map(str, partitions)
    )


def _render(msg: Any, codec: Any, *, as_json: bool) -> str:
    raw_key, raw = msg.key(), msg.value()
    key = raw_key.decode("utf-8", "backslashreplace") if raw_key is not None else None
    value: Any
    if raw is None:
        value = None  # a tombstone
    else:
        try:
            value = codec.decode(raw)
        except Exception:  # not the codec's: shown as text (or bytes) rather than hidden
            value = raw.decode("utf-8", "backslashreplace")
    headers = {
        name: (v.decode("utf-8", "backslashreplace") if v is not None else None)
        for name, v in (msg.headers() or [])
    }
    if as_json:
        return json.dumps(
            {
                "topic": msg.topic(),
                "partition": msg.partition(),
                "offset": msg.offset(),
                "timestamp": msg.timestamp()[1],
                "key": key,
                "value": value,
                "headers": headers,
            },
            default=str,
        )
    shown = json.dumps(value, default=str) if not isinstance(value, str) else value
    line = f"{msg.topic()}[{msg.partition()}]@{msg.offset()} key={key} {shown}"
    if headers:
        line += "  " + " ".join(f"{k}={v}" for k, v in headers.items())
    return line
