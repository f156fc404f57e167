"""OpenTelemetry traces of a real worker on the broker, read from the SDK's in-memory
exporter: a record's span under its incoming ``traceparent``, its action's span, its code
blocks' spans (executed, then replayed after a dead-letter replay, linked to the run that
executed them), and the ``traceparent`` its outputs and its dead letter carry."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agents_stream import App, tracing
from agents_stream.cli.dlq import read_dead_letters, replay
from agents_stream.testing.live import LiveWorker
from agents_stream.testing.topics import Inputs, create_topics, produce, wait_for_records
from tests.apps import dlq_app
from tests.apps.effects import connect

sdk = pytest.importorskip("opentelemetry.sdk.trace")
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)

pytestmark = pytest.mark.broker

APP = "tests.apps.dlq_app:app"

UPSTREAM_TRACE = "0af7651916cd43dd8448eb211c80319c"
UPSTREAM_SPAN = "b7ad6b7169203331"


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    provider = sdk.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use_provider(provider)
    try:
        yield exporter
    finally:
        tracing.use_provider(None)
        provider.shutdown()


def _wait(exporter, predicate, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [s for s in exporter.get_finished_spans() if predicate(s)]
        if found:
            return found
        time.sleep(0.1)
    names = [(s.name, dict(s.attributes or {})) for s in exporter.get_finished_spans()]
    raise AssertionError(f"no such span among {names}")


def _hex(context) -> tuple[str, str]:
    return f"{context.trace_id:032x}", f"{context.span_id:016x}"


def test_spans_of_records_actions_and_code_blocks(
    broker, topic_factory, spans, tmp_path, monkeypatch
):
    monkeypatch.setenv("AS_EFFECTS_DB", str(tmp_path / "effects.sqlite"))
    monkeypatch.delenv("AS_FIXED", raising=False)
    source, out = topic_factory("in"), topic_factory("out")
    create_topics(broker.bootstrap, [source], partitions=1)
    app = App(f"{source}-app", partitions=1, commit_interval=0.3)
    app.agent(dlq_app.Orders, input=source, output=out)
    inputs = Inputs(broker.bootstrap)
    upstream = f"00-{UPSTREAM_TRACE}-{UPSTREAM_SPAN}-01".encode()
    for order, bad in (("o1", "false"), ("o2", "true")):
        inputs.send(
            source, f'{{"order": "{order}", "bad": {bad}}}'.encode(), "u-17",
            headers=[("traceparent", upstream)],
        )  # fmt: skip
    inputs.close(30)
    with LiveWorker(app, broker=broker.url):
        [output] = wait_for_records(broker.bootstrap, out, 1, timeout=60)
        [letter] = read_dead_letters(broker.bootstrap, f"{source}-dlq")
        good = _wait(spans, lambda s: s.name == f"process {source}" and s.status.is_ok)[0]
        failed = _wait(spans, lambda s: s.name == f"process {source}" and not s.status.is_ok)[0]

        # The record's span continues the producer's trace; its action and code blocks
        # are its children; its output carries its traceparent.
        assert _hex(good.parent) == (UPSTREAM_TRACE, UPSTREAM_SPAN)
        assert good.attributes["messaging.kafka.message.key"] == "u-17"
        assert good.attributes["agents_stream.calls_executed"] == 2
        action = _wait(spans, lambda s: s.parent is not None
                       and s.parent.span_id == good.context.span_id)[0]  # fmt: skip
        assert action.name == "Orders.process#0"
        blocks = _wait(spans, lambda s: s.parent is not None
                       and s.parent.span_id == action.context.span_id)  # fmt: skip
        assert sorted(b.attributes["agents_stream.function"].rsplit(".", 1)[-1]
                      for b in blocks) == ["reserve", "ship"]  # fmt: skip
        for block in blocks:
            assert block.attributes["agents_stream.replayed"] is False
            assert block.attributes["agents_stream.attempt"] == 1
            assert block.attributes["agents_stream.status"] == "SUCCEEDED"
            assert f":{source}:u-17:" in block.attributes["agents_stream.call_id"]
        headers = dict(output.headers)
        trace_id, span_id = _hex(good.context)
        assert headers["traceparent"].decode() == f"00-{trace_id}-{span_id}-01"

        # The failed record: the action's exception is recorded; its dead letter carries
        # the failed run's traceparent, not the producer's.
        failed_action = _wait(spans, lambda s: s.parent is not None
                              and s.parent.span_id == failed.context.span_id)[0]  # fmt: skip
        assert not failed_action.status.is_ok
        assert [e.name for e in failed_action.events] == ["exception"]
        trace_id, span_id = _hex(failed.context)
        assert dict(letter.headers)["traceparent"].decode() == f"00-{trace_id}-{span_id}-01"
        [executed] = [s for s in spans.get_finished_spans()
                      if s.parent is not None and s.parent.span_id == failed_action.context.span_id]  # fmt: skip

        # Replayed after the fix, as a restarted worker would (nothing kept in memory):
        # the journaled call is replayed, its span linked to the run that executed it.
        monkeypatch.setenv("AS_FIXED", "1")
        tracing.CURRENT._executed.clear()  # type: ignore[union-attr]
        assert replay(broker.bootstrap, source, [letter]) == 1
        wait_for_records(broker.bootstrap, out, 2, timeout=60)
        replayed = _wait(spans, lambda s: s.attributes.get("agents_stream.replayed") is True)
        [block] = replayed
        assert (
            block.attributes["agents_stream.call_id"]
            == executed.attributes["agents_stream.call_id"]
        )
        assert block.attributes["agents_stream.status"] == "SUCCEEDED"
        [link] = block.links
        assert _hex(link.context) == _hex(failed.context)
        assert link.attributes["agents_stream.executed_by"] == "live"
        rerun = _wait(spans, lambda s: s.name == f"process {source}" and s.parent is not None
                      and s.parent.span_id == failed.context.span_id)[0]  # fmt: skip
        assert rerun.attributes["agents_stream.calls_replayed"] == 1
    reserves = connect().execute("SELECT call_id FROM effects WHERE kind = 'reserve'").fetchall()
    assert len(reserves) == 2, reserves  # o2's reservation ran once: replayed, not executed


def test_off_without_a_provider():
    """No provider configured and no OTEL_* variables: runners are not traced."""
    tracing.use_provider(None)
    specs = dlq_app.Orders.actions()
    assert tracing.traced_actions(specs) == (specs, None)


class _Receiver(ThreadingHTTPServer):
    """A local OTLP/HTTP trace receiver: keeps every export request it is sent."""

    def __init__(self) -> None:
        self.requests: list[bytes] = []
        received = self.requests

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                received.append(self.rfile.read(int(self.headers["Content-Length"])))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args: object) -> None:  # quiet
                pass

        super().__init__(("127.0.0.1", 0), Handler)

    def spans(self) -> list[tuple[str, str, dict[str, object]]]:
        """(service name, span name, attributes) of every span received."""
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        out = []
        for body in list(self.requests):
            request = ExportTraceServiceRequest.FromString(body)
            for resource in request.resource_spans:
                service = next(
                    a.value.string_value
                    for a in resource.resource.attributes
                    if a.key == "service.name"
                )
                for scope in resource.scope_spans:
                    for span in scope.spans:
                        attributes = {
                            a.key: getattr(a.value, a.value.WhichOneof("value"))
                            for a in span.attributes
                        }
                        out.append((service, span.name, attributes))
        return out


def test_worker_exports_over_otlp_configured_by_otel_variables(
    broker, topic_factory, worker_factory, tmp_path
):
    """A worker subprocess configured only by OTEL_* variables exports its spans to an
    OTLP/HTTP receiver."""
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
    receiver = _Receiver()
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    try:
        db = tmp_path / "effects.sqlite"
        connect(str(db)).close()
        env = {
            "AS_APP_ID": topic_factory("app"),
            "AS_INPUT": topic_factory("in"),
            "AS_OUTPUT": topic_factory("out"),
            "AS_EFFECTS_DB": str(db),
            "OTEL_SERVICE_NAME": "orders-worker",
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.server_port}",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_BSP_SCHEDULE_DELAY": "200",
        }
        create_topics(broker.bootstrap, [env["AS_INPUT"]], partitions=1)
        worker = worker_factory(APP, env)
        produce(broker.bootstrap, env["AS_INPUT"], [("u-1", {"order": "o1"})])
        wait_for_records(broker.bootstrap, env["AS_OUTPUT"], 1, timeout=60)
        assert worker.terminate() == 0, worker.log()  # flushes what is left at exit
        spans = receiver.spans()
        names = {name for _, name, _ in spans}
        assert {f"process {env['AS_INPUT']}", "Orders.process#0"} <= names, spans
        blocks = [a for _, _, a in spans if "agents_stream.call_id" in a]
        assert sorted(a["agents_stream.function"] for a in blocks) == [
            "tests.apps.dlq_app.reserve",
            "tests.apps.dlq_app.ship",
        ]
        assert all(a["agents_stream.replayed"] is False for a in blocks)
        assert {service for service, _, _ in spans} == {"orders-worker"}
    finally:
        receiver.shutdown()
