"""OpenTelemetry traces of records, actions and code blocks (the optional ``otel`` extra).

Off, at no cost per record, unless ``opentelemetry-api`` is importable *and* a tracer
provider is configured the standard way: set by the application
(``trace.set_tracer_provider``), named by ``OTEL_PYTHON_TRACER_PROVIDER``, or, with the
SDK installed, described by the ``OTEL_*`` variables (``OTEL_TRACES_EXPORTER``,
``OTEL_EXPORTER_OTLP_ENDPOINT``, ...), from which :func:`current` builds an SDK provider
with a batch processor and the exporters registered under those names.
``OTEL_SDK_DISABLED=true`` turns it off. Whether a runner traces is decided once, when it
is built (:func:`traced_actions`), not per record.

What the worker emits:

- one ``process <topic>`` span per input record (kind CONSUMER), a child of the W3C
  ``traceparent`` in the record's headers when it has one; it ends when the record is
  finished (committed-to-be), dead-lettered or abandoned;
- one span per action run (``Agent.method#n``), a child of its record's span;
- one span per code block, a child of its action's span, with ``agents_stream.replayed``,
  ``agents_stream.attempt``, ``agents_stream.call_id``, ``agents_stream.status`` (and the
  recorded exception of a FAILED call); a replayed call's span is linked to the span of
  the run that executed it when this process ran it, else (after a crash) to the
  record's incoming ``traceparent`` -- the run that executed it is a child of that
  same context -- with the journaled ``agents_stream.executed_by`` (worker id) and
  ``agents_stream.executed_at_ms`` on the link;
- outputs and dead letters carry the record span's ``traceparent`` (a dead letter's
  replay therefore continues the trace of the run that failed).

Metrics stay on Prometheus (``--metrics-port``).
"""

from __future__ import annotations

import inspect
import logging
import os
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import replace
from functools import wraps
from typing import TYPE_CHECKING, Any

from .agent import ActionSpec
from .events import InputEvent

if TYPE_CHECKING:
    from .durable.journal import ActionRef, CallEntry
    from .durable.runner import RecordInput, RecordOutcome

log = logging.getLogger(__name__)

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
# Span contexts of calls this process executed, for the links of their replays (a replay
# in the same process: a retried record, a partition that came back).
_EXECUTED_KEPT = 10_000
# Open record spans at most (far above any --max-in-flight): the oldest tenth is ended
# past it, so records dropped without a report cannot grow the map without bound.
_RECORDS_KEPT = 100_000

# The Traces of the provider configured now (None: tracing is off); the sink and the dead
# letters read it (they do not know the runner).
CURRENT: Traces | None = None


# A provider given by use_provider (tests, embedding apps), else the global one.
_PROVIDER: Any = None


def use_provider(provider: Any) -> None:
    """Trace runners built from now on with ``provider`` rather than the global tracer
    provider (None: the global one again). For tests and applications that keep their
    provider out of the process-wide OpenTelemetry state."""
    global _PROVIDER, CURRENT
    _PROVIDER = provider
    CURRENT = None


def current() -> Traces | None:
    """The :class:`Traces` of the configured tracer provider, or None when tracing is
    off (opentelemetry not installed, not configured, or ``OTEL_SDK_DISABLED``)."""
    global CURRENT
    try:
        from opentelemetry import trace
    except ImportError:
        return None
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    provider = _PROVIDER if _PROVIDER is not None else trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        built = _provider_from_environment()
        if built is None:
            return None
        trace.set_tracer_provider(built)
        provider = trace.get_tracer_provider()
    if CURRENT is None or CURRENT.provider is not provider:
        CURRENT = Traces(provider)
    return CURRENT


def _provider_from_environment() -> Any:
    """An SDK provider with the exporters ``OTEL_TRACES_EXPORTER`` names (default
    ``otlp`` when an OTLP endpoint is set), or None when the variables configure none."""
    names = os.environ.get("OTEL_TRACES_EXPORTER", "").strip()
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    if not names and not endpoint:
        return None
    exporters = [n.strip() for n in (names or "otlp").split(",") if n.strip()]
    if exporters == ["none"]:
        return None
    try:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning("OTEL_* variables set but opentelemetry-sdk is not installed: no traces")
        return None
    from importlib.metadata import entry_points

    provider = TracerProvider()  # resource from OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES
    added = 0
    for name in exporters:
        found = [
            point
            for candidate in _candidates(name)
            for point in entry_points(group="opentelemetry_traces_exporter", name=candidate)
        ]
        if not found:
            log.warning("no OpenTelemetry span exporter named %r is installed", name)
            continue
        provider.add_span_processor(BatchSpanProcessor(found[0].load()()))
        added += 1
    return provider if added else None


def _candidates(name: str) -> list[str]:
    """Registered exporter names for ``name``: ``otlp`` is the one of the protocol
    ``OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL`` names, or, unset, whichever OTLP exporter is
    installed (gRPC first, as the SDK's own default)."""
    if name != "otlp":
        return [name]
    protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL", ""
    )
    if protocol.startswith("http"):
        return ["otlp_proto_http"]
    if protocol == "grpc":
        return ["otlp_proto_grpc", "otlp"]
    return ["otlp_proto_grpc", "otlp", "otlp_proto_http"]


def traced_actions(specs: list[ActionSpec]) -> tuple[list[ActionSpec], Traces | None]:
    """``specs`` with each action's function wrapped in its span, and the Traces, when
    tracing is on; ``specs`` unchanged and None when it is off."""
    traces = current()
    if traces is None:
        return specs, None
    return [traces.wrap(spec) for spec in specs], traces


def _abandoned(exc: BaseException) -> bool:
    """Whether ``exc`` abandons a record rather than fails it (ownership lost)."""
    from .durable.ownership import OwnershipLost

    return isinstance(exc, OwnershipLost)


class _Headers:
    """The W3C propagator's getter/setter over Kafka headers."""

    @staticmethod
    def get(carrier: Mapping[str, bytes], key: str) -> list[str] | None:
        value = carrier.get(key)
        if value is None:
            return None
        return [value.decode("latin-1") if isinstance(value, bytes) else str(value)]

    @staticmethod
    def keys(carrier: Mapping[str, bytes]) -> list[str]:
        return list(carrier)


class Traces:
    """The spans of one tracer provider: per record, per action, per code block."""

    def __init__(self, provider: Any) -> None:
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        from . import __version__

        self.provider = provider
        self._trace = trace
        self._tracer = provider.get_tracer("agents_stream", __version__)
        self._w3c = TraceContextTextMapPropagator()
        # (topic, partition, seq) and (topic, partition, offset) -> the record's span and
        # its incoming span context (None without a traceparent)
        self._records: dict[tuple[str, int, int], tuple[Any, Any]] = {}
        self._executed: OrderedDict[str, Any] = OrderedDict()

    # -- records -------------------------------------------------------------------------
    def begin(self, topic: str, record: RecordInput, offset: int) -> None:
        """Open ``record``'s span (a child of its incoming ``traceparent``)."""
        parent = self._incoming(record.headers)
        span = self._tracer.start_span(
            f"process {topic}",
            context=parent,
            kind=self._trace.SpanKind.CONSUMER,
            attributes={
                "messaging.system": "kafka",
                "messaging.operation.type": "process",
                "messaging.destination.name": topic,
                "messaging.destination.partition.id": str(record.partition),
                "messaging.kafka.offset": offset,
                "messaging.kafka.message.key": record.key,
                "agents_stream.seq": record.seq,
            },
        )
        entry = (span, self._span_context(parent))
        records = self._records
        if len(records) >= _RECORDS_KEPT:  # records never reported (a stop mid-drain)
            for stale in list(records)[: _RECORDS_KEPT // 10]:
                dropped = records.pop(stale)[0]
                if dropped.is_recording():  # a replayed record is there twice
                    dropped.end()
        records[(topic, record.partition, record.seq)] = entry
        if offset != record.seq:  # a replayed dead letter: its dead letter finds it too
            self._records[(topic, record.partition, offset)] = entry

    def end(self, topic: str, record: RecordInput, offset: int, outcome: Any) -> None:
        """Close ``record``'s span with how it ended: a RecordOutcome, None (concluded
        after a failure already recorded), or the exception that failed or abandoned it.
        A failed record's span stays open until its dead letter is written (that carries
        the span's ``traceparent``): the exception is recorded, ``end(..., None)`` closes."""
        key = (topic, record.partition, record.seq)
        entry = self._records.get(key)
        if entry is None:
            return
        span = entry[0]
        if isinstance(outcome, Exception) and not _abandoned(outcome):
            span.record_exception(outcome)
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, str(outcome)))
            return
        del self._records[key]
        self._records.pop((topic, record.partition, offset), None)
        if isinstance(outcome, BaseException):  # abandoned: ownership lost, cancelled
            span.set_attribute("agents_stream.abandoned", type(outcome).__name__)
        elif outcome is not None:
            self._count(span, outcome)
        span.end()

    @staticmethod
    def _count(span: Any, outcome: RecordOutcome) -> None:
        span.set_attribute("agents_stream.actions_run", outcome.actions_run)
        span.set_attribute("agents_stream.actions_skipped", outcome.actions_skipped)
        span.set_attribute("agents_stream.calls_executed", outcome.calls_executed)
        span.set_attribute("agents_stream.calls_replayed", outcome.calls_replayed)
        span.set_attribute("agents_stream.outputs", len(outcome.outputs))

    def headers_for(self, topic: str, partition: int, seq: int) -> list[tuple[str, bytes]]:
        """The ``traceparent`` (and ``tracestate``) of a record's span, as Kafka headers
        for what it produces; [] when the record has no open span here."""
        entry = self._records.get((topic, partition, seq))
        if entry is None:
            return []
        carrier: dict[str, str] = {}
        self._w3c.inject(carrier, context=self._trace.set_span_in_context(entry[0]))
        return [(k, v.encode()) for k, v in carrier.items()]

    def _incoming(self, headers: Mapping[str, bytes] | None) -> Any:
        if not headers or TRACEPARENT not in headers:
            return None
        return self._w3c.extract(headers, getter=_Headers)  # type: ignore[arg-type]

    def _span_context(self, context: Any) -> Any:
        """The span context a propagated ``context`` holds, or None."""
        if context is None:
            return None
        found = self._trace.get_current_span(context).get_span_context()
        return found if found.is_valid else None

    # -- actions -------------------------------------------------------------------------
    def wrap(self, spec: ActionSpec) -> ActionSpec:
        """``spec`` whose function runs inside its action span (its flags kept: the
        wrapper is async exactly when the action is)."""
        fn = spec.fn
        start = self._action_started
        failed = self._action_failed
        if inspect.iscoroutinefunction(fn):

            @wraps(fn)
            async def traced_async(event: Any, ctx: Any) -> Any:
                span = start(event, ctx)
                try:
                    return await fn(event, ctx)
                except BaseException as exc:
                    failed(span, exc)
                    raise
                finally:
                    span.end()

            return replace(spec, fn=traced_async)

        @wraps(fn)
        def traced(event: Any, ctx: Any) -> Any:
            span = start(event, ctx)
            try:
                return fn(event, ctx)
            except BaseException as exc:
                failed(span, exc)
                raise
            finally:
                span.end()

        return replace(spec, fn=traced)

    def _action_started(self, event: Any, ctx: Any) -> Any:
        ref: ActionRef = ctx.ref
        record = self._records.get((ref.topic, ref.partition, ref.seq))
        if record is not None:
            parent = self._trace.set_span_in_context(record[0])
            incoming = record[1]
        else:  # a host without record spans (Faust, Spark, the test kit)
            parent = self._incoming(event.headers if isinstance(event, InputEvent) else None)
            incoming = self._span_context(parent)
        span = self._tracer.start_span(
            ref.action,
            context=parent,
            attributes={
                "agents_stream.action": ref.action,
                "agents_stream.key": ref.key,
                "agents_stream.seq": ref.seq,
                "agents_stream.partition": ref.partition,
                "agents_stream.topic": ref.topic,
                "agents_stream.event": type(event).__name__,
            },
        )
        ctx._trace = CallTrace(self, span, incoming)
        return span

    def _action_failed(self, span: Any, exc: BaseException) -> None:
        if isinstance(exc, Exception):
            span.record_exception(exc)
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, str(exc)))
        else:  # GreenletExit, CancelledError: abandoned, not failed
            span.set_attribute("agents_stream.abandoned", type(exc).__name__)

    # -- code blocks ---------------------------------------------------------------------
    def executed(self, call_id: str, context: Any) -> None:
        self._executed[call_id] = context
        if len(self._executed) > _EXECUTED_KEPT:
            self._executed.popitem(last=False)

    def executed_context(self, call_id: str) -> Any:
        return self._executed.get(call_id)


class CallTrace:
    """What a RunnerContext reports its code blocks to (``ctx._trace``): their spans,
    as children of the action's span."""

    __slots__ = ("_action", "_incoming", "_traces")

    def __init__(self, traces: Traces, action_span: Any, incoming: Any) -> None:
        self._traces = traces
        self._action = action_span
        # The record's incoming span context (what links a replay to a run that another
        # process executed: that run was a child of the same context).
        self._incoming = incoming

    def journaled(self, entry: CallEntry) -> None:
        """A call's entry was appended: PENDING is an event on the action span, a
        terminal outcome closes the call's span (started when the call started)."""
        if not entry.status.terminal:
            self._action.add_event(
                "pending",
                {"agents_stream.call_id": entry.call_id, "agents_stream.index": entry.index},
            )
            return
        span = self._span(entry, replayed=False, links=None, start_ms=entry.started_ms)
        self._traces.executed(entry.call_id, span.get_span_context())
        self._finish(span, entry, entry.finished_ms or None)

    def replayed(self, slot: CallEntry) -> None:
        """A journaled outcome was returned instead of running the call."""
        trace = self._traces._trace
        executed = self._traces.executed_context(slot.call_id)
        attributes = {
            "agents_stream.call_id": slot.call_id,
            "agents_stream.executed_by": slot.worker_id,
            "agents_stream.executed_at_ms": slot.finished_ms,
        }
        if executed is not None:
            link = trace.Link(executed, attributes)
        elif self._incoming is not None:
            link = trace.Link(self._incoming, attributes)
        else:
            link = trace.Link(trace.INVALID_SPAN_CONTEXT, attributes)
        span = self._span(slot, replayed=True, links=[link], start_ms=None)
        self._finish(span, slot, None)

    def _span(
        self, entry: CallEntry, *, replayed: bool, links: Sequence[Any] | None, start_ms: int | None
    ) -> Any:
        trace = self._traces._trace
        return self._traces._tracer.start_span(
            entry.function_id,
            context=trace.set_span_in_context(self._action),
            links=links,
            start_time=start_ms * 1_000_000 if start_ms else None,
            attributes={
                "agents_stream.call_id": entry.call_id,
                "agents_stream.call_index": entry.index,
                "agents_stream.function": entry.function_id,
                "agents_stream.status": entry.status.value,
                "agents_stream.attempt": entry.attempts,
                "agents_stream.replayed": replayed,
                "agents_stream.worker_id": entry.worker_id,
            },
        )

    def _finish(self, span: Any, entry: CallEntry, end_ms: int | None) -> None:
        exc = entry.exception
        if exc is not None:
            trace = self._traces._trace
            span.add_event(
                "exception",
                {
                    "exception.type": exc.type,
                    "exception.message": exc.message,
                    "exception.stacktrace": exc.traceback,
                },
            )
            span.set_status(trace.Status(trace.StatusCode.ERROR, f"{exc.type}: {exc.message}"))
        span.end(end_time=end_ms * 1_000_000 if end_ms else None)
