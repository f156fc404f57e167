"""When tracing is on: only with opentelemetry configured; never by accident."""

from __future__ import annotations

import logging

import pytest

from agents_stream import tracing
from tests.apps.dlq_app import Orders

sdk = pytest.importorskip("opentelemetry.sdk.trace")


def test_otel_variables_naming_no_installed_exporter_leave_tracing_off(monkeypatch, caplog):
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "no-such-exporter")
    with caplog.at_level(logging.WARNING, logger="agents_stream.tracing"):
        assert tracing.current() is None
    assert "no OpenTelemetry span exporter named 'no-such-exporter'" in caplog.text
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    assert tracing.current() is None


def test_otel_sdk_disabled_wins_over_a_provider(monkeypatch):
    tracing.use_provider(sdk.TracerProvider())
    try:
        monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
        specs = Orders.actions()
        assert tracing.traced_actions(specs) == (specs, None)
        monkeypatch.delenv("OTEL_SDK_DISABLED")
        traced, traces = tracing.traced_actions(specs)
        assert traces is not None and traced[0].fn is not specs[0].fn
        assert traced[0].is_async == specs[0].is_async and traced[0].name == specs[0].name
    finally:
        tracing.use_provider(None)
