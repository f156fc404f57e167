"""``worker --metrics-port``: Prometheus metrics, ``/healthz`` and ``/readyz`` on one port.

The hot path gains no per-record work: :class:`WorkerCollector` reads the counters the
worker keeps anyway (``Worker.stats``, each AgentHost's ``counts``, the execution
controller, the consumer's cached watermarks) when Prometheus scrapes. Two things have
no counter to read and are fed from outside the record path: journal ack latency (from
the producer's delivery batches, on its poll thread) and non-deterministic replays (the
durable core's truncation warnings).

* ``/metrics``  the Prometheus text format;
* ``/healthz``  200 while the process runs and its event loop answers within 2 s;
* ``/readyz``   200 once partitions are assigned and their caches rebuilt, 503 before
  (and during a rebalance, when the eager protocol revokes everything first).

The server binds ``127.0.0.1`` unless told otherwise: metrics name topics and keys'
partitions, which not every network should see.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from confluent_kafka import TopicPartition
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..durable.inflight import calls_in_flight
from ..errors import ConfigurationError

if TYPE_CHECKING:
    from ..kafka.producer import Ack
    from .worker import Worker

log = logging.getLogger("agents_stream.metrics")

PREFIX = "agents_stream"
LOOP_TIMEOUT = 2.0  # seconds the event loop may take to run a probe before /healthz fails

# Worker.stats keys exported as counters: (stats key, metric name, help).
WORKER_COUNTERS = (
    ("records", "records", "input records finished (actions done or dead-lettered)"),
    ("calls_executed", "calls_executed", "code blocks executed"),
    ("calls_replayed", "calls_replayed", "code blocks replayed from the journal"),
    ("actions_skipped", "actions_skipped", "completed actions skipped on re-consumption"),
    (
        "outputs_found",
        "outputs_found",
        "outputs of recovered actions not marked emitted that were found in the output "
        "topic (not sent again)",
    ),
    (
        "outputs_resent",
        "outputs_resent",
        "outputs of recovered actions not marked emitted that were sent (not found)",
    ),
    ("dlq", "dead_letters", "records sent to <input>-dlq"),
    ("timers_fired", "timers_fired", "timers fired"),
    ("timer_errors", "timer_errors", "timer firings whose action raised (dropped)"),
    ("watermarks", "watermarks", "watermarks processed"),
    (
        "offset_gaps",
        "offset_gaps",
        "input records whose offset skipped past the previous one's + 1 (compaction or "
        "transaction markers, or records the client never delivered)",
    ),
    (
        "kafka_calls_blocked",
        "kafka_calls_blocked",
        "Kafka client calls (transactions, synchronous commits) that blocked past the "
        "worker's own deadline: their client was replaced or the call retried",
    ),
    (
        "commit_partitions_excluded",
        "commit_partitions_excluded",
        "partitions left out of a commit because a rebalance took them after its snapshot",
    ),
    (
        "offset_gaps_recovered",
        "offset_gaps_recovered",
        "offset gaps the client had skipped: fetched again from the first missing offset",
    ),
    (
        "records_undelivered",
        "records_undelivered",
        "records whose journal or output write the cluster did not take (timed out, "
        "fenced, too few replicas): abandoned, not dead-lettered, and run again from the "
        "committed offsets",
    ),
    (
        "journal_stalls",
        "journal_stalls",
        "times the broker stopped answering journal writes long enough that new code "
        "blocks waited (runtime/connectivity.py: below min ISR, a broker or link down)",
    ),
    (
        "broker_silences",
        "broker_silences",
        "journal silences past the freeze limit: the worker's partitions were given up "
        "and the group asked again",
    ),
)


def _snapshot(mapping: Mapping[Any, Any]) -> list[tuple[Any, Any]]:
    """Items of a dict another thread may grow meanwhile (a scrape must not crash)."""
    for _ in range(5):
        try:
            return list(mapping.items())
        except RuntimeError:  # changed size during iteration
            continue
    return []


class TruncationCounter(logging.Handler):
    """Counts the durable core's non-deterministic replay warnings, per agent.

    The core journals a Truncation and logs one warning per mismatch; counting the
    warning keeps the core free of metrics code.
    """

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.counts: dict[str, int] = {}

    def emit(self, record: logging.LogRecord) -> None:
        if not str(record.msg).startswith("non-deterministic replay"):
            return
        try:
            action = str(record.args[2])  # type: ignore[index]
        except (IndexError, KeyError, TypeError):
            action = "?"
        agent = action.split(".", 1)[0]
        self.counts[agent] = self.counts.get(agent, 0) + 1


class WorkerCollector(Collector):
    """Reads a running :class:`Worker`'s counters and gauges at scrape time."""

    def __init__(self, worker: Worker, truncations: TruncationCounter) -> None:
        self._worker = worker
        self._truncations = truncations

    def collect(self) -> Iterator[Metric]:
        w = self._worker
        stats = w.stats
        for key, name, doc in WORKER_COUNTERS:
            c = CounterMetricFamily(f"{PREFIX}_{name}", doc)
            c.add_metric([], stats.get(key, 0))
            yield c
        yield from self._agents(w)
        truncated = CounterMetricFamily(
            f"{PREFIX}_calls_truncated",
            "journal slots truncated by a non-deterministic replay (events)",
            labels=["agent"],
        )
        for agent, n in _snapshot(self._truncations.counts):
            truncated.add_metric([agent], n)
        yield truncated
        controller = getattr(w, "controller", None)
        yield _gauge("in_flight", "records running or buffered", _attr(controller, "in_flight"))
        yield _gauge(
            "in_flight_peak", "highest in-flight count", _attr(controller, "peak_in_flight")
        )
        yield _gauge("in_flight_limit", "in-flight limit before partitions pause", w.max_in_flight)
        yield from self._code_blocks(w)
        owned = sorted(_snapshot(dict.fromkeys(_owned(w))))
        assigned = GaugeMetricFamily(
            f"{PREFIX}_assigned_partitions", "input partitions owned", labels=["topic"]
        )
        per_topic: dict[str, int] = {}
        for (topic, _), _ in owned:
            per_topic[topic] = per_topic.get(topic, 0) + 1
        for topic, n in sorted(per_topic.items()):
            assigned.add_metric([topic], n)
        yield assigned
        yield _gauge(
            "paused_partitions",
            "owned partitions paused by the in-flight limit",
            len(owned) if w.intake.paused else 0,
        )
        yield _gauge(
            "registry_paused_partitions",
            "partitions waiting for the schema registry to accept (host/registry_wait.py)",
            _attr(getattr(w, "registry_wait", None), "paused"),
        )
        yield _gauge("ready", "1 when partitions are assigned and caches rebuilt", int(w.ready))
        watch = getattr(w, "connectivity", None)
        yield _gauge(
            "journal_unanswered_seconds",
            "seconds since the broker last answered a journal write, while writes are "
            "outstanding (0 when none are); new code blocks wait while it is over a few "
            "times the usual gap",
            watch.unanswered() if watch is not None else 0.0,
        )
        yield _gauge(
            "journal_stalled",
            "1 while new code blocks wait for the broker to answer the journal",
            int(bool(getattr(getattr(w, "ownership", None), "stalled", False))),
        )
        yield _gauge(
            "rebuilding_partitions",
            "input partitions whose journal caches are being caught up",
            w.rebuilding,
        )
        settler = getattr(w, "settler", None)
        if settler is not None:
            yield _gauge(
                "two_phase_waiting",
                "two-phase calls prepared and not yet committed or aborted (commits wait "
                "for their record's completion to be durable)",
                settler.waiting,
            )
            for key, doc in (
                ("two_phase_prepared", "two-phase calls prepared (journaled PREPARED)"),
                ("two_phase_committed", "two-phase calls committed (journaled COMMITTED)"),
                ("two_phase_aborted", "two-phase calls aborted (journaled ABORTED)"),
                ("two_phase_failures", "commit/abort attempts that raised (retried)"),
            ):
                c = CounterMetricFamily(f"{PREFIX}_{key}", doc)
                c.add_metric([], settler.stats.get(key, 0))
                yield c
        replayed = CounterMetricFamily(
            f"{PREFIX}_rebuild_records", "journal records replayed into caches on assignment"
        )
        replayed.add_metric([], stats.get("journal_records_replayed", 0))
        yield replayed
        yield from self._lag(w, [tp for tp, _ in owned])

    @staticmethod
    def _code_blocks(w: Worker) -> Iterable[Metric]:
        pool = w._pool
        yield _gauge(
            "code_blocks_running", "code blocks running on the worker's threads", pool.running
        )
        yield _gauge(
            "code_blocks_waiting",
            "code blocks queued for a thread (> 0: raise --code-block-threads)",
            pool.waiting,
        )
        yield _gauge(
            "code_block_threads_limit", "threads that run code blocks, at most", pool.max_workers
        )
        # Every journaled call started and not yet journaled (sync and async actions): a
        # SIGKILL now runs each of them again on the next owner (docs/operations.md).
        yield _gauge(
            "calls_in_flight",
            "journaled calls running, not yet acknowledged (run again after a crash now)",
            calls_in_flight(),
        )
        stats = w.stats
        for name, doc in (
            ("ownership_suspensions", "times every partition was fenced after a freeze"),
            ("records_abandoned_not_owned", "records abandoned: their partition was lost"),
            ("registry_retries", "records tried again after a schema registry refusal"),
        ):
            counter = CounterMetricFamily(f"{PREFIX}_{name}", doc)
            counter.add_metric([], stats.get(name, 0))
            yield counter
        waited = CounterMetricFamily(
            f"{PREFIX}_code_blocks_waited", "code blocks that had to wait for a thread"
        )
        waited.add_metric([], pool.waited)
        yield waited
        transactions = getattr(w, "transactions", None)
        if transactions is not None:  # exactly-once (docs/operations.md)
            ended = CounterMetricFamily(
                f"{PREFIX}_transactions",
                "transactions ended, by outcome (aborted: partitions taken again)",
                labels=["outcome"],
            )
            ended.add_metric(["committed"], transactions.commits)
            ended.add_metric(["aborted"], transactions.aborts)
            yield ended
            renewed = CounterMetricFamily(
                f"{PREFIX}_transactional_producers_replaced",
                "transactional producers replaced after being fenced",
            )
            renewed.add_metric([], transactions.renewals)
            yield renewed

    def _agents(self, w: Worker) -> Iterable[Metric]:
        rin = CounterMetricFamily(
            f"{PREFIX}_agent_records_in",
            "input records taken by an agent",
            labels=["agent", "topic"],
        )
        rout = CounterMetricFamily(
            f"{PREFIX}_agent_records_out", "outputs sent by an agent", labels=["agent", "topic"]
        )
        failed = CounterMetricFamily(
            f"{PREFIX}_agent_records_failed",
            "records an agent dead-lettered, by stage (decode, action)",
            labels=["agent", "topic", "stage"],
        )
        tombstones = CounterMetricFamily(
            f"{PREFIX}_agent_tombstones",
            "input records with a null value (skipped unless tombstones='deliver')",
            labels=["agent", "topic"],
        )
        for topic, host in _snapshot(getattr(w, "_agents", {})):
            counts = _snapshot(host.counts)
            rin.add_metric([host.name, topic], dict(counts).get("in", 0))
            rout.add_metric([host.name, topic], dict(counts).get("out", 0))
            tombstones.add_metric([host.name, topic], dict(counts).get("tombstones", 0))
            for name, n in counts:
                if name.startswith("failed:"):
                    failed.add_metric([host.name, topic, name.split(":", 1)[1]], n)
        return [rin, rout, failed, tombstones]

    def _lag(self, w: Worker, owned: list[tuple[str, int]]) -> Iterable[Metric]:
        """Per owned partition, from the high watermark cached by the last fetch (no
        broker round trip): the lag an alert should watch, high watermark minus the
        committed position (records fetched but not finished are still lag: a worker
        with 200 records stuck in flight is 200 behind, not 0); the records fetched and
        not finished; and the fetch lag (high watermark minus the consumer position)."""
        lag = GaugeMetricFamily(
            f"{PREFIX}_consumer_lag",
            "records not yet committed: high watermark minus the committed position",
            labels=["topic", "partition"],
        )
        unfinished = GaugeMetricFamily(
            f"{PREFIX}_records_unfinished",
            "records fetched and started, not yet finished (part of consumer_lag)",
            labels=["topic", "partition"],
        )
        fetch_lag = GaugeMetricFamily(
            f"{PREFIX}_fetch_lag",
            "records not yet fetched: high watermark minus the consumer position",
            labels=["topic", "partition"],
        )
        committed = GaugeMetricFamily(
            f"{PREFIX}_committed_offset",
            "last offset committed by this worker",
            labels=["topic", "partition"],
        )
        held = dict(_snapshot(getattr(w, "partitions", {})))
        # Offsets of the partitions that had a record since their assignment.
        trackers = {tp: part.offsets for tp, part in held.items() if part.offsets.next >= 0}
        consumer = getattr(w, "consumer", None)
        if consumer is not None and owned:
            try:
                positions = consumer.position([TopicPartition(t, p) for t, p in owned])
                for tp in positions:
                    _, high = consumer.get_watermark_offsets(tp, cached=True)
                    if tp.offset < 0 or high < 0:
                        continue
                    labels = [tp.topic, str(tp.partition)]
                    fetch_lag.add_metric(labels, max(high - tp.offset, 0))
                    tracker = trackers.get((tp.topic, tp.partition))
                    base = tp.offset  # nothing fetched since the assignment
                    if tracker is not None:
                        unfinished.add_metric(labels, tracker.in_flight)
                        base = tracker.committed
                        if base < 0:  # nothing committed yet: the oldest unfinished record
                            base = tracker.oldest
                    lag.add_metric(labels, max(high - base, 0))
            except Exception as exc:  # closing, or a partition revoked meanwhile
                log.debug("lag not collected: %s", exc)
        # Every held partition: a partition that got no record in this run shows the
        # group's committed offset as found at its assignment.
        for (topic, partition), part in held.items():
            position = max(part.offsets.committed, part.committed_at_assign)
            if position >= 0:
                committed.add_metric([topic, str(partition)], position)
        return [lag, unfinished, fetch_lag, committed]


def _owned(w: Worker) -> frozenset[tuple[str, int]]:
    for _ in range(5):
        try:
            return frozenset(w.partitions)
        except RuntimeError:  # the kafka thread (re)assigned meanwhile
            continue
    return frozenset()


def _attr(obj: object, name: str) -> float:
    return float(getattr(obj, name, 0) or 0)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    g = GaugeMetricFamily(f"{PREFIX}_{name}", doc)
    g.add_metric([], value)
    return g


class MetricsServer:
    """The HTTP endpoint of one worker; :meth:`close` stops it."""

    def __init__(self, worker: Worker, host: str, port: int) -> None:
        self.worker = worker
        self.registry = CollectorRegistry(auto_describe=False)
        self.truncations = TruncationCounter()
        self.ack_latency = Histogram(
            f"{PREFIX}_journal_ack_seconds",
            "time from producing a journal record to its broker acknowledgement",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
            registry=self.registry,
        )
        self.registry.register(WorkerCollector(worker, self.truncations))
        try:
            self._server = ThreadingHTTPServer((host, port), _handler(self))
        except OSError as exc:
            raise ConfigurationError(
                f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}; choose another "
                "--metrics-port"
            ) from exc
        logging.getLogger("agents_stream.durable").addHandler(self.truncations)
        worker.setup_hooks.append(self._attach)
        self._server.daemon_threads = True
        self.address = self._server.server_address
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="agents-stream-metrics", daemon=True
        )

    def start(self) -> MetricsServer:
        self._thread.start()
        log.info("metrics on http://%s:%d/metrics (/healthz, /readyz)", *self.address[:2])
        return self

    def close(self) -> None:
        logging.getLogger("agents_stream.durable").removeHandler(self.truncations)
        self._server.shutdown()
        self._server.server_close()

    def _attach(self, worker: Worker) -> None:
        """After the worker's setup: journal acks feed the latency histogram."""
        topic = worker.app.action_state_topic if worker.app.agents else None
        if topic is None:
            return

        def observe(batch: list[Ack]) -> None:
            now = time.monotonic()
            for ack in batch:
                if ack.topic == topic and ack.error is None and ack.sent:
                    self.ack_latency.observe(now - ack.sent)

        worker.producer.observe_acks(observe)

    # -- probes ---------------------------------------------------------------------------
    def healthy(self) -> tuple[bool, str]:
        loop = self.worker.loop
        if loop is None:
            return True, "starting"
        answered = threading.Event()
        try:
            loop.call_soon_threadsafe(answered.set)
        except RuntimeError:
            return False, "event loop closed"
        if not answered.wait(LOOP_TIMEOUT):
            return False, f"event loop did not answer within {LOOP_TIMEOUT:g}s"
        return True, "ok"

    def ready(self) -> tuple[bool, str]:
        if self.worker.ready:
            return True, "ok"
        if self.worker.rebuilding:
            return False, "rebuilding caches"
        blocked = self.worker.deadline.blocked
        if blocked is not None:
            return False, f"{blocked} blocked past its deadline"
        return False, "no partitions assigned"


def _handler(server: MetricsServer) -> type[BaseHTTPRequestHandler]:
    probes: dict[str, Callable[[], tuple[bool, str]]] = {
        "/healthz": server.healthy,
        "/readyz": server.ready,
    }

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._reply(200, generate_latest(server.registry), CONTENT_TYPE_LATEST)
            elif path in probes:
                ok, why = probes[path]()
                self._reply(200 if ok else 503, f"{why}\n".encode(), "text/plain")
            else:
                self._reply(404, b"try /metrics, /healthz or /readyz\n", "text/plain")

        def _reply(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            """Scrapes every few seconds would drown the worker's own log."""

    return Handler


def serve_metrics(worker: Worker, host: str, port: int) -> MetricsServer:
    """Bind (failing fast if the port is taken) and serve in a daemon thread."""
    return MetricsServer(worker, host, port).start()
