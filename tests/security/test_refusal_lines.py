"""The lines a refused login, an untrusted certificate or a missing ACL ends in, without a
broker: what the cluster refused, and the setting or ACL to fix; no secret in them."""

from __future__ import annotations

from confluent_kafka import KafkaError

from agents_stream.errors import KafkaIOError
from agents_stream.host.policy import Verdict, classify
from agents_stream.kafka.admin import denial, refusal


def test_authentication_and_tls_refusals_name_the_setting(monkeypatch):
    monkeypatch.setenv("AGENTS_STREAM_KAFKA_SASL_PASSWORD", "hunter2-secret")
    auth = KafkaError(
        KafkaError._AUTHENTICATION,
        "sasl_ssl://10.0.0.1:9093/bootstrap: SASL authentication error: Authentication failed "
        "during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512 "
        "(password hunter2-secret) (after 312ms in state AUTH_REQ)",
    )
    line = refusal(auth, "10.0.0.1:9093")
    assert line is not None and "hunter2-secret" not in line
    assert line.startswith("the Kafka cluster at 10.0.0.1:9093 refused authentication (SASL")
    assert "sasl.username / sasl.password" in line and "after 312ms" not in line
    tls = KafkaError(KafkaError._SSL, "ssl://h:9093/bootstrap: SSL handshake failed: certificate verify failed")  # fmt: skip
    line = refusal(tls, "h:9093")
    assert line is not None and "ssl.ca.location" in line and "certificate verify failed" in line
    assert refusal(KafkaError(KafkaError._TRANSPORT, "connection refused"), "h:9093") is None


def test_a_denied_journal_write_is_fatal_and_names_the_acl(monkeypatch):
    monkeypatch.setenv("AGENTS_STREAM_KAFKA_SASL_USERNAME", "payments")
    exc = KafkaIOError(
        'delivery to pay-action-state failed: KafkaError{code=TOPIC_AUTHORIZATION_FAILED,val=29,str="Broker: Topic authorization failed"}',
        code=KafkaError.TOPIC_AUTHORIZATION_FAILED,
    )
    line = denial(exc)
    assert line is not None
    assert line.startswith(
        "the Kafka cluster refused User:payments a write to topic pay-action-state"
    )
    assert "grant it Write on topic pay-action-state" in line and "agents-stream acls" in line
    assert denial(KafkaIOError(line, code=exc.code)) == line  # not wrapped twice
    # Not the record's fault: no dead letter (every record would follow it there).
    assert classify(exc, "dlq") is Verdict.FATAL
    other = KafkaIOError("delivery to t failed: timed out", code=KafkaError._MSG_TIMED_OUT)
    assert denial(other) is None and classify(other, "dlq") is Verdict.DEAD_LETTER


def test_a_reader_denied_its_group_names_the_prefixed_acl():
    exc = KafkaIOError(
        "reading pay-action-state[0]: KafkaError{code=GROUP_AUTHORIZATION_FAILED,val=30,"
        'str="FindCoordinator response error: Group authorization failed."}',
        code=KafkaError.GROUP_AUTHORIZATION_FAILED,
    )
    line = denial(exc)
    assert line is not None and "a reader of pay-action-state" in line
    assert "Describe on the groups prefixed agents-stream-" in line
