"""The source's options as Spark users write them, without a broker: the Java client's
``kafka.*`` names translated or refused, the timestamp options parsed, ``subscribePattern``
read as Java's ``find``; every refusal is one :class:`KafkaSourceError` line naming the
option and what to write instead, and no ``assert`` guards the source."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from agents_stream.spark.source import KafkaSourceError, KafkaSourceOptions
from agents_stream.spark.source.client_names import REFUSED, RENAMED
from agents_stream.spark.source.options import compile_topic_pattern

BASE = {"kafka.bootstrap.servers": "h:1", "subscribe": "t"}
SOURCE = Path(__file__).resolve().parents[2] / "agents_stream" / "spark" / "source"


def parse(**options: str) -> KafkaSourceOptions:
    return KafkaSourceOptions.from_options({**BASE, **options})


def refusal(option: str, **options: str) -> str:
    """The message of the refusal of ``options``, checked to be one line naming ``option``."""
    with pytest.raises(KafkaSourceError) as info:
        parse(**options)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{option}: "), message
    assert getattr(info.value, "option", None) == option
    return message


def test_java_client_names_become_librdkafkas() -> None:
    conf = parse(
        **{
            "kafka.fetch.max.wait.ms": "20",
            "kafka.receive.buffer.bytes": "65536",
            "kafka.request.timeout.ms": "15000",
            "kafka.max.partition.fetch.bytes": "1048576",  # a librdkafka alias already
            "kafka.ssl.endpoint.identification.algorithm": "",
            "kafka.partition.assignment.strategy": (
                "org.apache.kafka.clients.consumer.CooperativeStickyAssignor"
            ),
            "kafka.max.poll.records": "777",
        }
    )
    assert conf.kafka_conf == {
        "bootstrap.servers": "h:1",
        "fetch.wait.max.ms": "20",
        "socket.receive.buffer.bytes": "65536",
        "socket.timeout.ms": "15000",
        "max.partition.fetch.bytes": "1048576",
        "ssl.endpoint.identification.algorithm": "none",
        "partition.assignment.strategy": "cooperative-sticky",
    }
    assert conf.batch_size == 777  # max.poll.records: records per poll, the reader's batch
    # Every translated name is one librdkafka knows (its consumer accepts the settings).
    from confluent_kafka import Consumer

    Consumer({"group.id": "g", **conf.consumer_conf("reader")}).close()
    assert set(RENAMED.values()) >= {"fetch.wait.max.ms", "socket.timeout.ms"}


def test_jaas_credentials_become_sasl_username_and_password() -> None:
    jaas = (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="alice" password="s3\\"cret";'
    )
    conf = parse(**{"kafka.sasl.jaas.config": jaas}).kafka_conf
    assert (conf["sasl.username"], conf["sasl.password"]) == ("alice", 's3"cret')
    assert "s3" not in repr(parse(**{"kafka.sasl.jaas.config": jaas}))
    message = refusal(
        "kafka.sasl.jaas.config",
        **{
            "kafka.sasl.jaas.config": "com.sun.security.auth.module.Krb5LoginModule required "
            "useKeyTab=true;"
        },
    )
    assert "kafka.sasl.kerberos" in message


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_java_only_names_are_refused_naming_what_to_use(name: str) -> None:
    message = refusal(f"kafka.{name}", **{f"kafka.{name}": "x"})
    fix = message.split(": ", 1)[1]
    assert any(w in fix for w in ("kafka", "remove it", "DataFrame", "immutable")), message


def test_reserved_settings_name_the_source_option_to_use() -> None:
    assert "startingOffsets" in refusal(
        "kafka.auto.offset.reset", **{"kafka.auto.offset.reset": "earliest"}
    )
    assert "never commit" in refusal(
        "kafka.enable.auto.commit", **{"kafka.enable.auto.commit": "true"}
    )


def test_timestamp_options_follow_sparks_precedence() -> None:
    conf = parse(
        startingTimestamp="1700000000000",
        startingOffsetsByTimestamp='{"t":{"0":5}}',
        startingOffsets="earliest",
        endingOffsetsByTimestamp='{"t":{"0":1700000009000,"1":1700000009000}}',
        startingOffsetsByTimestampStrategy="LATEST",
    )
    assert conf.starting_timestamps == 1_700_000_000_000  # startingTimestamp wins
    assert conf.ending_timestamps == {"t": {0: 1_700_000_009_000, 1: 1_700_000_009_000}}
    assert conf.timestamp_strategy == "latest"
    assert parse().starting_timestamps is None and parse().timestamp_strategy == "error"
    refusal("startingTimestamp", startingTimestamp="yesterday")
    refusal("endingTimestamp", endingTimestamp="-5")
    refusal("endingOffsetsByTimestamp", endingOffsetsByTimestamp='{"t":[1]}')
    refusal("startingOffsetsByTimestamp", startingOffsetsByTimestamp="{}")
    refusal("startingOffsetsByTimestampStrategy", startingOffsetsByTimestampStrategy="earliest")


def test_subscribe_pattern_is_found_anywhere_like_javas_find() -> None:
    found = compile_topic_pattern("plain")
    assert found.search("xc-plain") and compile_topic_pattern("^xc-pl").search("xc-plain")
    assert not compile_topic_pattern("^plain").search("xc-plain")
    # Java's named groups read as Python's.
    assert compile_topic_pattern(r"(?<env>prod|dev)-orders").search("eu-prod-orders")
    message = refusal(
        "subscribePattern",
        **{"subscribe": "", "subscribePattern": r"\p{Alpha}+"},
    )
    assert "Java-only" in message


def test_streaming_and_unknown_options_are_refused_with_the_reason() -> None:
    assert "batches only" in refusal("maxOffsetsPerTrigger", maxOffsetsPerTrigger="10")
    assert "sink" in refusal("topic", topic="t")
    assert "valid options" in refusal("startingOffset", startingOffset="earliest")


def test_no_assert_guards_the_source() -> None:
    """``python -O`` drops asserts and a user sees a bare AssertionError otherwise: every
    check of the source raises a KafkaSourceError instead."""
    paths = [*SOURCE.glob("*.py"), SOURCE.parent / "frames" / "journal_source.py"]
    asserts = [
        f"{path.name}:{node.lineno}"
        for path in paths
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Assert)
    ]
    assert asserts == []
