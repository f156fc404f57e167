"""The executor side of ``spark backfill``: one Kafka partition's input records, run
through an agent with the worker's durable semantics. Imports nothing from PySpark.

For one partition, in order:

1. Decode the partition's snapshot of the ActionState topic (live records only, any
   schema version; an undecodable record fails the task, as it would stop a worker) into
   an :class:`~agents_stream.state.memory.InMemoryActionStateStore`.
2. Run the input records through :class:`~agents_stream.durable.runner.ActionRunner`
   (asyncio), as the worker does: a key's records one after another in offset order,
   up to ``BackfillTask.concurrency`` records of distinct keys at once (a slow call
   must not hold back every other key of the partition). Completed actions are skipped
   (their outputs replayed, memory applied once), journaled calls are replayed,
   everything else executes; new entries go to the in-memory store, so later records of
   the same key see the memory the earlier ones left. Rows come back in offset order.
3. Optionally append the new entries (and truncation tombstones) to the ActionState
   topic, same keys and partition as the worker would write, so that a later worker or
   backfill replays them instead of executing again.

Outputs are not produced here. The ActionDones are journaled *not* marked emitted: a
worker that later meets them sends their outputs, unless the job produced them to the
agent's own output topic. For that case (``BackfillTask.emits``) each row also carries
the outputs not yet in that topic with their identity headers (``sends``, ``send_ids``:
what the worker's sink would send) and the emitted markers to journal once they are
acked (``mark_keys``, ``mark_values``); the driver side (``emit_rows``) produces the
former, then writes the latter. A job that dies in between leaves outputs whose headers
a recovering worker finds (``host/output_log.py``), as after a worker crash.

An action that raises is reported in the record's ``error`` (the worker would send the
record to its DLQ) and the partition goes on.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any

from ...ackfuture import resolved
from ...app import AgentBinding, App
from ...durable.errors import FATAL_ERRORS
from ...durable.journal import ActionDone, JournalEntry, expand
from ...durable.keys import encode_identity, entry_key_bytes
from ...durable.output_identity import OUTPUT_HEADER, output_prefix
from ...durable.pool import CodeBlockPool
from ...durable.runner import ActionRunner, RecordInput
from ...durable.sink import Sink
from ...errors import KafkaIOError
from ...host.kit import DurableHost
from ...host.output_log import OutputLog
from ...kafka.config import common_config, configure, delivery_timeout_ms, producer_config
from ...serde.journal import default_journal_codec
from ...serde.values import JsonValueCodec
from ...state.memory import InMemoryActionStateStore
from ..errors import TaskRecordError

log = logging.getLogger("agents_stream.spark.backfill")

RESULT_DDL = (
    "partition INT, input_offset BIGINT, key STRING, outputs ARRAY<BINARY>, "
    "actions_run INT, actions_skipped INT, calls_executed INT, calls_replayed INT, "
    "error STRING, completed BOOLEAN, sends ARRAY<BINARY>, send_ids ARRAY<STRING>, "
    "mark_keys ARRAY<BINARY>, mark_values ARRAY<BINARY>, output_ids ARRAY<STRING>"
)
"""Spark schema of the per-record results of a backfill task."""


@dataclass(frozen=True)
class InputRecord:
    partition: int
    offset: int
    key: str
    value: bytes | None
    timestamp_ms: int | None = None
    keyless: bool = False  # no record key: no memory, no timers, as in the worker


def _driver_client_config() -> tuple[tuple[str, Any], ...]:
    """The driver's common client configuration (security settings), for executors: their
    processes never saw --kafka-config or App(kafka_config). Plain values only (a
    callback does not pickle)."""
    return tuple(
        (k, v) for k, v in sorted(common_config().items()) if isinstance(v, str | int | float)
    )


# The settings of a client configuration that say how to reach and log in to the cluster.
_CONNECTION = ("security.", "sasl.", "ssl.", "ssl_", "enable.ssl", "oauthbearer", "client.",
               "schema.registry.")  # fmt: skip


def _on_executor(conf: dict[str, Any]) -> None:
    """Make the clients an executor builds itself (journal writer, output lookup) use the
    connection settings of ``conf``, a client configuration made on the driver."""
    connection = {
        k: v for k, v in conf.items() if k.startswith(_CONNECTION) and isinstance(v, str | int)
    }
    if connection:
        configure(connection)


@dataclass(frozen=True)
class BackfillTask:
    """Everything a task needs; pickled to executors (the App by value, agent classes by
    reference: executors import the app's module).

    Attributes:
        app: the app; ``binding`` indexes ``app.agents``.
        app_id: the id call ids and the ActionState topic derive from (default app.id).
        state_topic: where journal entries go when ``write_journal`` is set.
        bootstrap: bootstrap servers (journal writes only).
        rerun_completed: run inputs the worker group finished too (explicit opt-in).
        committed: the worker group's committed offsets, used where no marker exists.
        emits: outputs go to the agent's own output topic: rows carry what to send
            there (the outputs not in it yet, with identity headers) and the emitted
            markers to journal afterwards (written only with ``write_journal``).
        concurrency: records of distinct keys a task runs at once (1: one at a time).
        kafka_config: the driver's common client configuration (captured when the task is
            made), applied on the executor before any client is built.
    """

    app: App
    binding: int
    app_id: str
    state_topic: str
    bootstrap: str
    write_journal: bool = False
    rerun_completed: bool = False
    committed: tuple[tuple[int, int], ...] = ()  # worker group's (partition, offset)
    emits: bool = False
    concurrency: int = 64
    kafka_config: tuple[tuple[str, Any], ...] = field(default_factory=_driver_client_config)

    def __repr__(self) -> str:  # the configuration may hold a password
        return f"BackfillTask(app_id={self.app_id!r}, state_topic={self.state_topic!r})"

    @property
    def agent_binding(self) -> AgentBinding:
        return self.app.agents[self.binding]


def run_partition(
    task: BackfillTask,
    partition: int,
    records: Sequence[InputRecord],
    state: Sequence[tuple[bytes, bytes] | tuple[bytes, bytes, int]],
) -> list[dict[str, Any]]:
    """Runs one partition's records (steps in the module docstring); one row per record.

    ``state`` holds the partition's live journal records as (key, value) or (key, value,
    offset): with the offset, a record that cannot be decoded is named by it.
    """
    _on_executor(dict(task.kafka_config))  # SASL/TLS of --kafka-config, App(kafka_config)
    codec = default_journal_codec(task.app.schema_registry_url, task.state_topic)
    entries: list[JournalEntry] = []
    for record in state:
        try:
            entries.extend(expand(codec.decode(record[0], record[1])))  # a group: its dones
        except FATAL_ERRORS as exc:
            if len(record) < 3:
                raise
            raise TaskRecordError(
                exc, topic=task.state_topic, partition=partition, offset=int(record[2])
            ) from exc
    store = _TaskStore(entries)
    binding = task.agent_binding
    # The task's binding alone, under the id its call ids and journal derive from.
    app = replace(task.app, id=task.app_id)
    app.agent(
        binding.agent,
        input=binding.input,
        output=binding.output,
        input_schema=binding.input_schema,
        output_schema=binding.output_schema,
    )
    output_log = None
    if task.emits and binding.output is not None and task.app.output_scan_window > 0:
        # An ActionDone not marked emitted may have its outputs in the topic already (a
        # worker died after they were acked): those are not sent again.
        output_log = OutputLog(
            task.bootstrap,
            binding.output,
            task.app_id,
            window_s=task.app.output_scan_window,
            delivery_timeout=delivery_timeout_ms(
                producer_config(task.bootstrap, task.app.producer_config)
            ),
        )
    held = _HeldOutputs(task.app_id, output_log)
    # A thread for each record that may be in a code block at once (started on demand).
    threads = max(task.concurrency, task.app.code_block_threads)
    pool = CodeBlockPool(threads, thread_name_prefix="backfill")
    try:
        kit = DurableHost(
            app,
            bootstrap=task.bootstrap,
            data_dir="",
            worker_id=f"spark-backfill-p{partition}",
            executor=pool,
            store=store,
            sinks={binding.input: held},
            produce=False,  # outputs come back as rows; the driver writes them
            two_phase=False,  # nothing here settles obligations: such calls are refused
        )
        # Pre-v5 entries belong to the whole app's first input, not this binding's.
        store.legacy_topics = frozenset(task.app.input_topics[:1])
        bound = kit.bindings[binding.input]
        runner, in_codec = bound.runner, bound.input_codec
        out_codec = bound.output_codec or JsonValueCodec()
        below = 0 if task.rerun_completed else completed_through(task, store, partition)
        todo = [r for r in records if r.offset >= below]
        rows = [_completed_row(r) for r in records if r.offset < below]
        try:
            rows += asyncio.run(
                _run_all(runner, todo, in_codec, out_codec, held, store, codec, task.concurrency)
            )
        finally:
            if held.output_log is not None:
                held.output_log.close()
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    rows.sort(key=lambda row: row["input_offset"])
    if not task.emits:
        for row in rows:  # nothing goes to the agent's topic: the worker will send them
            row.update(sends=[], send_ids=[], mark_keys=[], mark_values=[])
    if task.write_journal and store.log:
        _write_journal(task, partition, store.log, codec)
    return rows


def completed_through(task: BackfillTask, store: InMemoryActionStateStore, partition: int) -> int:
    """Offset below which the input is done: the partition's InputProgress marker, or,
    for a journal without one (written before markers), the worker group's committed
    offset. Guarantee 8: what the worker group finished is never charged again."""
    marker = store.progress(task.agent_binding.input, partition)
    if marker is not None:
        return marker.offset
    return dict(task.committed).get(partition, 0)


def _completed_row(rec: InputRecord) -> dict[str, Any]:
    return {
        "partition": rec.partition, "input_offset": rec.offset, "key": rec.key,
        "outputs": [], "actions_run": 0, "actions_skipped": 0,
        "calls_executed": 0, "calls_replayed": 0, "error": None, "completed": True,
        "sends": [], "send_ids": [], "mark_keys": [], "mark_values": [], "output_ids": [],
    }  # fmt: skip


class _TaskStore(InMemoryActionStateStore):
    """The snapshot store of a task. Emitted markers are held, not journaled with the
    task's entries: the outputs they vouch for are produced after the task, if at all.
    They are kept per input record (its offset, the ``seq`` of its actions), since the
    records of distinct keys run at once."""

    def __init__(self, entries: Sequence[JournalEntry]) -> None:
        super().__init__(entries)
        self.markers: dict[int, list[ActionDone]] = {}

    def note(self, entries: Sequence[Any], partition: int) -> None:
        for entry in entries:
            if isinstance(entry, ActionDone):
                self.markers.setdefault(entry.ref.seq, []).append(entry)

    def take_markers(self, offset: int) -> list[ActionDone]:
        return self.markers.pop(offset, [])

    def output_ids(self, origin: str, rec: InputRecord, count: int) -> list[str]:
        """The identity of each of the record's ``count`` outputs, in the order its
        actions sent them (the worker's ``x-agents-stream-output`` values), or none if
        its ActionDones do not account for exactly those outputs."""
        with self._lock:
            found = [self._entries[i] for i in self._record(rec.key, rec.offset) if i[0] == "a"]
        dones = sorted(
            (d for d in found if isinstance(d, ActionDone) and d.ref.partition == rec.partition),
            key=lambda d: _ordinal(d.ref.action),
        )
        ids = [f"{output_prefix(origin, d)}{i}" for d in dones for i in range(len(d.outputs))]
        return ids if len(ids) == count else []


def _ordinal(action: str) -> int:
    """``Agent.method#3`` -> 3: the order in which a record's actions ran."""
    digits = "".join(c for c in action.rsplit("#", 1)[-1] if c.isdigit())
    return int(digits or 0)


class _HeldOutputs(Sink):
    """The task's output sink: produces nothing, keeps the outputs the worker's sink
    would send (those of ActionDones not marked emitted) with their identity headers,
    per input record."""

    threadsafe = True

    def __init__(self, origin: str, output_log: OutputLog | None = None) -> None:
        self.origin = origin
        self.output_log = output_log
        # An attribute, not a property: OutputSink declares it settable. The output log
        # is only given here, so it stays true to it.
        self.finds_outputs = output_log is not None
        self.held: dict[int, list[tuple[Any, str]]] = {}

    def send(
        self,
        key: str,
        values: Sequence[Any],
        partition: int,
        stored: Sequence[bytes] | None = None,
        *,
        done: ActionDone | None = None,
        indexes: Sequence[int] | None = None,
    ) -> Future[None]:
        assert done is not None
        prefix = output_prefix(self.origin, done)
        numbers = range(len(values)) if indexes is None else indexes
        held = self.held.setdefault(done.ref.seq, [])
        held.extend((v, f"{prefix}{j}") for v, j in zip(values, numbers, strict=True))
        return resolved()

    def take(self, offset: int) -> list[tuple[Any, str]]:
        return self.held.pop(offset, [])

    def landed(self, done: ActionDone, indexes: Sequence[int]) -> list[int]:
        return [] if self.output_log is None else self.output_log.landed(done, indexes)


async def _run_all(
    runner: ActionRunner,
    records: Sequence[InputRecord],
    in_codec: Any,
    out_codec: Any,
    held: _HeldOutputs,
    store: _TaskStore,
    codec: Any,
    concurrency: int = 1,
) -> list[dict[str, Any]]:
    """Rows of ``records``: each key's in offset order, ``concurrency`` keys at once."""
    lanes: dict[Any, list[InputRecord]] = {}
    for rec in sorted(records, key=lambda r: r.offset):
        # Keyless records share no state (no memory, no timers): each is a lane of its own.
        lanes.setdefault(("", rec.offset) if rec.keyless else rec.key, []).append(rec)
    todo = deque(lanes.values())
    rows: list[dict[str, Any]] = []

    async def drain() -> None:
        while todo:
            for rec in todo.popleft():
                rows.append(await _run_one(runner, rec, in_codec, out_codec, held, store, codec))

    await asyncio.gather(*(drain() for _ in range(max(1, min(concurrency, len(todo))))))
    return rows


async def _run_one(
    runner: ActionRunner,
    rec: InputRecord,
    in_codec: Any,
    out_codec: Any,
    held: _HeldOutputs,
    store: _TaskStore,
    codec: Any,
) -> dict[str, Any]:
    row: dict[str, Any] = {
        "partition": rec.partition, "input_offset": rec.offset, "key": rec.key,
        "outputs": [], "actions_run": 0, "actions_skipped": 0,
        "calls_executed": 0, "calls_replayed": 0, "error": None, "completed": False,
        "sends": [], "send_ids": [], "mark_keys": [], "mark_values": [], "output_ids": [],
    }  # fmt: skip
    try:
        value = in_codec.decode(rec.value)
        outcome = await runner.run(
            RecordInput(
                rec.key,
                rec.offset,
                value,
                rec.partition,
                rec.timestamp_ms,
                keyless=rec.keyless,
            )
        )
    except FATAL_ERRORS as exc:
        # An unreadable journal or a strict-mode divergence: no state may be guessed,
        # so the job fails, as the worker stops, instead of reporting one bad row; the
        # driver's one-line error names the record.
        raise TaskRecordError(
            exc, topic=runner.topic, partition=rec.partition, offset=rec.offset
        ) from exc
    except Exception as exc:  # the worker's on_error="dlq": report and go on
        log.warning("backfill: %s@%d key=%r failed: %r", rec.partition, rec.offset, rec.key, exc)
        row["error"] = f"{type(exc).__name__}: {exc}"
    else:
        sends, marks = held.take(rec.offset), store.take_markers(rec.offset)
        row.update(
            outputs=[out_codec.encode(v) for v in outcome.outputs],
            actions_run=outcome.actions_run,
            actions_skipped=outcome.actions_skipped,
            calls_executed=outcome.calls_executed,
            calls_replayed=outcome.calls_replayed,
            sends=[out_codec.encode(v) for v, _ in sends],
            send_ids=[i for _, i in sends],
            mark_keys=[entry_key_bytes(m) for m in marks],
            mark_values=[codec.encode(m) for m in marks],
            output_ids=store.output_ids(held.origin, rec, len(outcome.outputs)),
        )
    # A record that failed keeps its ActionDones unmarked: whoever runs it next (a
    # worker, a dead-letter replay) sends their outputs. What it held is dropped.
    held.take(rec.offset)
    store.take_markers(rec.offset)
    return row


def produce_outputs(
    conf: dict[str, Any],
    topic: str,
    records: Iterable[tuple[str, bytes] | tuple[str, bytes, str]],
) -> int:
    """Produces ``(key, value)`` outputs in order, each with its identity header when a
    third item gives one, and waits for every ack.

    Raises:
        KafkaIOError: a record was not acknowledged.
    """
    from confluent_kafka import Producer

    errors: list[str] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    producer = Producer(conf)
    n = 0
    for key, value, *identity in records:
        headers = [(OUTPUT_HEADER, identity[0].encode())] if identity else None
        while True:
            try:
                producer.produce(
                    topic, value=value, key=key.encode(), headers=headers, on_delivery=on_delivery
                )
                break
            except BufferError:
                producer.poll(0.1)
        n += 1
    if producer.flush(60) != 0 or errors:
        raise KafkaIOError(f"{topic}: {len(errors)} outputs failed: {errors[:3]}")
    return n


def emit_rows(
    conf: dict[str, Any],
    topic: str,
    rows: Iterable[Any],
    *,
    bootstrap: str,
    state_topic: str | None,
    already: OutputLog | None = None,
    codec: Any = None,
) -> int:
    """Sends the ``sends`` of result rows (one input partition's, in offset order) to
    the agent's own output topic with their identity headers and, once every one is
    acked, journals the rows' emitted markers to ``state_topic`` (None: none written).
    With ``already`` (a retried attempt, whose predecessor may have sent some of them)
    and the journal ``codec`` of the markers, outputs found in the topic are not sent
    again. Returns how many outputs were sent."""
    _on_executor(conf)
    rows = list(rows)
    n = produce_outputs(
        conf,
        topic,
        (
            (row["key"], value, ident)
            for row in rows
            for value, ident in _unlanded(row, already, codec)
        ),
    )
    marks = [
        (row["partition"], k, v)
        for row in rows
        for k, v in zip(row["mark_keys"], row["mark_values"], strict=True)
    ]
    if state_topic is not None and marks:
        from ..frames.state_writer import ActionStateWriter

        # Not before: a marker says the outputs are in the topic.
        with ActionStateWriter(bootstrap, state_topic) as writer:
            writer.write_raw(marks)
    return n


def _unlanded(row: Any, already: OutputLog | None, codec: Any) -> list[tuple[bytes, str]]:
    """The row's ``(value, identity)`` sends, less those ``already`` finds in the log."""
    sends = list(zip(row["sends"], row["send_ids"], strict=True))
    if already is None or not sends:
        return sends
    dones = [codec.decode(k, v) for k, v in zip(row["mark_keys"], row["mark_values"], strict=True)]
    by_prefix = {output_prefix(already.origin, d): d for d in dones}
    out = []
    for value, ident in sends:
        head, _, index = ident.rpartition("/")
        done = by_prefix.get(head + "/")
        if done is None or not already.landed(done, [int(index)]):
            out.append((value, ident))
    return out


def _write_journal(task: BackfillTask, partition: int, log_entries: list[Any], codec: Any) -> None:
    from ..frames.state_writer import ActionStateWriter

    with ActionStateWriter(task.bootstrap, task.state_topic, codec) as writer:
        for item in log_entries:
            if isinstance(item, tuple):  # ("delete", identity): a truncated slot
                writer.write_raw([(partition, encode_identity(item[1]), None)])
            else:
                writer.write([(partition, item)])
