"""One registry setting everywhere (issue 52): where the URL comes from, schema.registry.*
client settings through the Kafka config layers (kept out of librdkafka's), secrets
redacted, subject strategies, and what a registry failure means to the record policy.
No server: these are the pure parts."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from agents_stream import App
from agents_stream.cli.common import apply_registry
from agents_stream.cli.main import build_parser
from agents_stream.errors import ConfigurationError
from agents_stream.host.policy import Verdict, classify
from agents_stream.kafka import config
from agents_stream.serde.errors import RegistryUnavailable, SchemaRefused
from agents_stream.serde.registry import (
    REGISTRY_ENV,
    auto_register,
    registry_client,
    registry_failure,
    registry_settings,
    resolve_registry_url,
)
from agents_stream.serde.subjects import value_subject

SECRET = "reg-s3cret-do-not-print"
RECORD = {"type": "record", "name": "Order", "namespace": "shop", "fields": []}


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch):
    for name in list(os.environ):
        if name.startswith(("AGENTS_STREAM_KAFKA", REGISTRY_ENV)):
            monkeypatch.delenv(name)
    yield
    config.configure({})


def test_flag_beats_environment_beats_app(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_registry_url(None, "http://app") == "http://app"
    monkeypatch.setenv(REGISTRY_ENV, "http://env")
    assert resolve_registry_url(None, "http://app") == "http://env"
    assert resolve_registry_url("http://flag", "http://app") == "http://flag"
    app = App("reg", schema_registry_url="http://app")
    apply_registry(app, argparse.Namespace(schema_registry=None))
    assert app.schema_registry_url == "http://env"


@pytest.mark.parametrize(
    "argv",
    [
        ["worker", "-A", "m:app"],
        ["state", "show", "-A", "m:app", "--key", "k"],
        ["dlq", "show", "-A", "m:app"],
        ["produce", "t", "{}"],
        ["tail", "t"],
        ["spark", "audit", "-A", "m:app"],
    ],
)
def test_every_command_takes_schema_registry(argv: list[str]) -> None:
    args = build_parser().parse_args([*argv, "--schema-registry", "http://flag"])
    assert args.schema_registry == "http://flag"


def test_settings_ride_the_kafka_layers_and_stay_out_of_librdkafka(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    props = tmp_path / "client.properties"
    props.write_text(
        "security.protocol=SASL_SSL\n"
        "schema.registry.ssl.ca.location=/etc/ca.pem\n"
        "schema.registry.timeout=3\n"
    )
    monkeypatch.setenv("AGENTS_STREAM_KAFKA_SCHEMA_REGISTRY_BASIC_AUTH_USER_INFO", f"user:{SECRET}")
    config.configure({"schema.registry.auto.register.schemas": "false"}, props)
    assert registry_settings() == {
        "ssl.ca.location": "/etc/ca.pem",
        "timeout": "3",
        "basic.auth.user.info": f"user:{SECRET}",
        "auto.register.schemas": "false",
    }
    assert auto_register() is False
    for conf in (config.producer_config("b:9092"), config.consumer_config("b:9092", "g")):
        assert not [k for k in conf if k.startswith("schema.registry.")]
        assert conf["security.protocol"] == "SASL_SSL"
    shown = config.redact(config.common_config())
    assert SECRET not in repr(shown)
    assert SECRET not in config.scrub(f"401 for user:{SECRET}")


def test_client_takes_the_settings_and_names_a_bad_one() -> None:
    config.configure({"schema.registry.basic.auth.user.info": f"u:{SECRET}"})
    client = registry_client("http://127.0.0.1:1")
    assert client._rest_client.auth == ("u", SECRET)
    assert client._rest_client.timeout == 10  # our deadline, not confluent's none
    config.configure({"schema.registry.max.retries": "many"})
    with pytest.raises(Exception, match=r"schema\.registry\.max\.retries must be a number"):
        registry_client("http://127.0.0.1:1")


def test_failures_name_subject_version_and_reason() -> None:
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    refused = registry_failure(
        SchemaRegistryError(409, 409, "Incompatible artifact: reader union lacking writer"),
        url=f"http://u:{SECRET}@reg:8081",
        subject="orders-value",
        version="ActionState v6",
        doing="register",
    )
    assert isinstance(refused, SchemaRefused)
    text = str(refused)
    assert "refused ActionState v6 under subject 'orders-value'" in text
    assert "reader union lacking writer (HTTP 409)" in text and SECRET not in text
    down = registry_failure(
        ConnectionRefusedError("[Errno 111] Connection refused"),
        url="http://reg:8081",
        subject="orders-value",
        version="ActionState v6",
        doing="register",
    )
    assert isinstance(down, RegistryUnavailable) and "unavailable" in str(down)
    assert isinstance(
        registry_failure(
            SchemaRegistryError(503, 50301, "busy"),
            url="http://reg",
            subject="s",
            version="v",
            doing="register",
        ),
        RegistryUnavailable,
    )


def test_registry_errors_are_never_dead_letters() -> None:
    for exc in (
        SchemaRefused("x", subject="s", version="v", reason="r"),
        RegistryUnavailable("x", subject="s", version="v", reason="r"),
    ):
        assert classify(exc, "dlq") is Verdict.FATAL


def test_subject_strategies() -> None:
    assert value_subject("orders", RECORD) == "orders-value"
    assert value_subject("orders", RECORD, "record") == "shop.Order"
    assert value_subject("orders", RECORD, "topic_record") == "orders-shop.Order"
    with pytest.raises(ConfigurationError, match="record schema"):
        value_subject("orders", {"type": "string"}, "record")
    with pytest.raises(ConfigurationError, match="subject_name_strategy"):
        App("reg", subject_name_strategy="nope")  # type: ignore[arg-type]
