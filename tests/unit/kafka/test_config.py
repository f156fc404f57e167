"""One Kafka client configuration: layering, the environment, properties files, redaction,
topic-name validation."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from agents_stream import App
from agents_stream.errors import ConfigurationError
from agents_stream.kafka import config
from agents_stream.kafka.admin import validate_topic_names

SECRET = "hunter2-do-not-print"


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch):
    for name in list(__import__("os").environ):
        if name.startswith("AGENTS_STREAM_KAFKA"):
            monkeypatch.delenv(name)
    yield
    config.configure({})


def test_env_names_map_to_properties() -> None:
    env = {
        "AGENTS_STREAM_KAFKA_SASL_PASSWORD": "p",
        "AGENTS_STREAM_KAFKA_LOG__LEVEL": "7",
        "AGENTS_STREAM_KAFKA_CONFIG": "/not/a/property",
        "OTHER": "x",
    }
    assert config.env_properties(env) == {"sasl.password": "p", "log_level": "7"}


def test_layers_app_then_file_then_env_then_client_overrides(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "client.properties"
    path.write_text("# comment\n! also\n\nclient.id = from-file\nsocket.timeout.ms=1000\n")
    monkeypatch.setenv("AGENTS_STREAM_KAFKA_SOCKET_TIMEOUT_MS", "2000")
    config.configure({"client.id": "from-app", "security.protocol": "SSL"}, path)
    conf = config.consumer_config("h:1", "g", {"security.protocol": "PLAINTEXT"})
    assert conf["client.id"] == "from-file"
    assert conf["socket.timeout.ms"] == "2000"
    assert conf["security.protocol"] == "PLAINTEXT"
    assert conf["bootstrap.servers"] == "h:1"
    for build in (config.producer_config, config.reader_config, config.admin_config):
        assert build("h:1")["client.id"] == "from-file"


def test_bad_properties_line_names_its_number_not_its_text(tmp_path: Path) -> None:
    path = tmp_path / "client.properties"
    path.write_text(f"client.id=a\n{SECRET}\n")
    with pytest.raises(ConfigurationError) as err:
        config.configure({}, path)
    assert ":2:" in str(err.value) and SECRET not in str(err.value)


def test_secrets_are_redacted_in_logs_and_reprs(caplog: pytest.LogCaptureFixture) -> None:
    secrets = {
        "sasl.password": SECRET,
        "ssl.key.password": SECRET,
        "ssl.keystore.password": SECRET,
        "sasl.jaas.config": SECRET,
        "basic.auth.user.info": SECRET,
        "sasl.oauthbearer.client.secret": SECRET,
    }
    assert SECRET not in str(config.redact(secrets))
    config.configure(secrets)
    with caplog.at_level(logging.DEBUG, logger="agents_stream.kafka"):
        conf = config.producer_config("h:1")
    assert conf["sasl.password"] == SECRET  # the client itself gets it
    assert "producer client config" in caplog.text and SECRET not in caplog.text
    app = App("repr", kafka_config=secrets, producer_config={"sasl.password": SECRET})
    assert SECRET not in repr(app)


def test_librdkafka_log_is_deduplicated(caplog: pytest.LogCaptureFixture) -> None:
    logger = config.rdkafka_logger()
    line = "FAIL [rdkafka#consumer-{n}] [thrd:x]: h:1/bootstrap: Connect failed (after {n}ms{s})"
    with caplog.at_level(logging.DEBUG, logger="agents_stream.librdkafka"):
        logger.error(line.format(n=1, s=""))
        logger.error(line.format(n=2, s=", 4 identical error(s) suppressed"))
        logger.error("FAIL [rdkafka#producer-1] [thrd:x]: something else")
    assert len(caplog.records) == 2


def test_librdkafka_fatal_lines_are_not_the_workers_critical(caplog) -> None:
    """CRITICAL means the worker stops; a fenced producer is replaced (a WARNING), a
    client's other fatal lines are ERROR."""
    logger = config.rdkafka_logger()
    with caplog.at_level(logging.DEBUG, logger="agents_stream.librdkafka"):
        logger.critical("TXNERR [rdkafka#producer-2] [thrd:main]: fenced by a newer instance")
        logger.critical("FATAL [rdkafka#producer-3] [thrd:main]: Fatal error: something")
    assert [r.levelname for r in caplog.records] == ["WARNING", "ERROR"]


@pytest.mark.parametrize("name", ["", ".", "..", "a b", "a/b", "ü", "x" * 250, "tab\t"])
def test_illegal_topic_names(name: str) -> None:
    with pytest.raises(ConfigurationError, match="invalid topic name"):
        validate_topic_names(["ok", name])


def test_legal_topic_names() -> None:
    validate_topic_names(["a", "A-b_c.9", "x" * 249, "..."])


def test_scrub_removes_secret_values_quoted_back() -> None:
    config.configure({"sasl.password": SECRET})
    text = f'Invalid value "{SECRET}" for "ssl.key.password"; also "{"other-secret"}"'
    scrubbed = config.scrub(text, {"ssl.key.password": "other-secret", "client.id": "abc"})
    assert SECRET not in scrubbed and "other-secret" not in scrubbed
    assert scrubbed.count(config.REDACTED) == 2


def test_registry_credentials_in_urls_are_redacted() -> None:
    url = f"https://agents:{SECRET}@registry.example:8081/path"
    assert config.redact_url(url) == "https://agents:[redacted]@registry.example:8081/path"
    assert config.redact_url("http://registry:8081") == "http://registry:8081"
    assert SECRET not in config.scrub(f"GET {url} failed", config.url_secrets(url))
    assert SECRET not in repr(App("reg", schema_registry_url=url))


def test_spark_source_options_carry_the_common_config() -> None:
    from agents_stream.spark.source.options import KafkaSourceOptions, source_options

    config.configure({"client.id": "spark-probe", "sasl.password": SECRET})
    options = source_options("h:1", "t", **{"kafka.client.id": "per-read"})
    parsed = KafkaSourceOptions.from_options(options)
    assert parsed.kafka_conf["sasl.password"] == SECRET
    assert parsed.kafka_conf["client.id"] == "per-read"  # explicit options win
    assert parsed.consumer_conf("reader")["sasl.password"] == SECRET
    assert SECRET not in repr(parsed)


def test_delivery_timeout_follows_librdkafka() -> None:
    from agents_stream.kafka.config import delivery_timeout_ms

    assert delivery_timeout_ms({}) == 300_000  # librdkafka's default
    assert delivery_timeout_ms({"message.timeout.ms": 45_000}) == 45_000  # the alias
    assert delivery_timeout_ms({"delivery.timeout.ms": "60000"}) == 60_000
    assert delivery_timeout_ms({"delivery.timeout.ms": 0}) is None  # retries forever
