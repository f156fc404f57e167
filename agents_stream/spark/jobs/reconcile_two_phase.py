"""``spark reconcile --two-phase``: settle the two-phase calls the workers left waiting.

A two-phase call (``TwoPhaseCommitCallable``, journal v8) leaves an obligation beside its
call slot: PREPARED until the owner of its partition commits it, ABORTING once an abort
is decided. The workers settle them (``durable/twophase.py``); this job settles, in bulk
and with the workers stopped, those left open (a partition nobody holds, a commit that
kept failing), deciding by the same durable facts the workers decide by:

* **commit** a PREPARED obligation when its input record is below its partition's
  completed-through marker (InputProgress) and the action that prepared it has its
  ActionDone (standalone or in a completion group): the action completed, its outputs
  are in the log;
* **abort** an ABORTING one (the abort was decided), and a PREPARED one whose record is
  below the marker with no ActionDone (the record was skipped: it never completes);
* leave the others (the record is not below the marker: its next run decides).

For each decided obligation the user's object is rebuilt from the journal (``target``
with :func:`~agents_stream.durable.values.decode_value`: the app's module is imported
first; ``prepared`` with the app's payload codec) and its ``commit``/``abort`` is called
on the driver, in call order per record, with the call id (``<call id>~<round>`` after
an abort) when its first parameter is ``call_id``; tried ``tries`` times. When it returns,
the obligation is journaled COMMITTED / ABORTED (``settled_ms``, ``attempts`` + 1, worker
``spark-reconcile``) under its own key and partition, so compaction replaces the open
one; when every try raised, it is journaled still open (an abort as ABORTING: decided)
with the attempts and the last error, for the next run or the next worker.

A dry run decides and reports: it calls nothing and writes nothing. The records of
settled obligations are not pruned here (a worker pruning committed records prunes
records it settles itself; see the report).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

from pyspark.sql import functions as F

from ...durable.identity import call_shape
from ...durable.journal import TwoPhase, TwoPhaseCall
from ...durable.twophase import round_call_id
from ...durable.values import decode_value
from .common import log

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from ...durable.payload import PayloadCodec
    from ...serde.journal import JournalCodec

RECONCILER_ID = "spark-reconcile"
TWO_PHASE_DDL = (
    "partition INT, topic STRING, key STRING, seq BIGINT, action STRING, index INT, "
    "call_id STRING, function_id STRING, phase STRING, round INT, decision STRING, "
    "outcome STRING, attempts INT, error STRING"
)
"""Columns of the two-phase decisions (``out_dir/two_phase_decisions``)."""

Decision = Literal["commit", "abort"]
OPEN_PHASES = (TwoPhase.PREPARED.value, TwoPhase.ABORTING.value)


def decide_obligation(x: TwoPhaseCall, through: int | None, done: bool) -> Decision | None:
    """What is owed on open obligation ``x``: its record's partition marker is
    ``through`` (exclusive; None: none) and ``done`` says whether its action has its
    ActionDone. None: not decided yet (the record is not below the marker)."""
    if not x.phase.open:
        return None
    if x.phase is TwoPhase.ABORTING:
        return "abort"
    if through is None or not 0 <= x.ref.seq < through:
        return None
    return "commit" if done else "abort"


@dataclass(frozen=True)
class Settled:
    """The outcome of settling one obligation: the entry to journal (None: nothing, a
    dry run), whether the user's method returned, and the last error if not."""

    entry: TwoPhaseCall | None
    returned: bool
    attempts: int
    error: str


def settle_obligation(
    x: TwoPhaseCall,
    decision: Decision,
    codec: PayloadCodec,
    *,
    tries: int = 3,
    backoff_s: float = 0.5,
    now_ms: int | None = None,
) -> Settled:
    """Calls ``commit``/``abort`` of ``x``'s object until it returns (at most ``tries``
    times), and builds the obligation to journal: COMMITTED / ABORTED when it returned,
    else still open with the attempts and the last error (an abort as ABORTING).

    Raises:
        ValueError: the target or the prepared result does not decode (e.g. the class it
            names is not imported: the app's module must be).
    """
    commit = decision == "commit"
    target = decode_value(x.target)
    prepared = None if x.prepared is None else codec.decode(x.prepared)
    method = getattr(target, decision)
    args, kwargs = call_shape(method).arguments(round_call_id(x.call_id, x.round), (prepared,), {})
    attempts, error, delay = x.attempts, x.last_error, backoff_s
    returned = False
    for attempt in range(max(1, tries)):
        attempts += 1
        try:
            method(*args, **kwargs)
            returned = True
            break
        except Exception as exc:
            error = f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}"
            log.warning(
                "reconcile: %s of two-phase call %s (%s, key=%r seq=%s action=%s index=%d) "
                "failed, attempt %d: %s",
                decision, x.call_id, x.function_id, x.ref.key, x.ref.seq, x.ref.action,
                x.index, attempts, error,
            )  # fmt: skip
            if attempt + 1 < tries:
                time.sleep(delay)
                delay *= 2
    now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
    if returned:
        phase = TwoPhase.COMMITTED if commit else TwoPhase.ABORTED
        entry = replace(
            x, phase=phase, settled_ms=now_ms, attempts=attempts, last_error=error,
            worker_id=RECONCILER_ID,
        )  # fmt: skip
    else:  # still owed; an abort stays decided
        phase = TwoPhase.PREPARED if commit else TwoPhase.ABORTING
        entry = replace(
            x, phase=phase, attempts=attempts, last_error=error, worker_id=RECONCILER_ID
        )
    return Settled(entry, returned, attempts, error)


def open_obligations(journal: DataFrame) -> list[Any]:
    """The open obligations of the decoded journal (``include_raw``), each row with the
    facts a decision needs: ``done`` (the action's ActionDone exists) and ``through``
    (its partition's completed-through marker for its input topic, or null). One Spark
    job; rows in call order per record."""
    kind = F.col("kind")
    run = ["partition", "topic", "key", "seq", "action"]
    obligations = journal.where((kind == "two_phase") & F.col("phase").isin(*OPEN_PHASES))
    dones = journal.where(kind == "done").select(*run).distinct().withColumn("done", F.lit(True))
    # A marker row: its topic, the journal partition (the input partition), the offset.
    markers = (
        journal.where(kind == "progress")
        .groupBy("partition", "topic")
        .agg(F.max("seq").alias("through"))
    )
    return (
        obligations.select(*run, "index", "raw_value")
        .join(dones, run, "left")
        .join(markers, ["partition", "topic"], "left")
        .orderBy(*run, "index")
        .collect()
    )


def settle_two_phase(
    rows: Iterable[Any],
    codec: JournalCodec,
    payload_codec: PayloadCodec,
    *,
    dry_run: bool = False,
    tries: int = 3,
    backoff_s: float = 0.5,
    now_ms: int | None = None,
) -> tuple[dict[str, int], list[dict[str, Any]], list[tuple[int, TwoPhaseCall]]]:
    """Decides and settles the rows of :func:`open_obligations`.

    Returns:
        ``(counts, decisions, writes)``: how many were open, committed, aborted, failed
        (every try raised) and left open; one decision row per obligation
        (:data:`TWO_PHASE_DDL`); the ``(partition, entry)`` pairs to journal (none in a
        dry run).
    """
    counts = {
        "two_phase_open": 0,
        "two_phase_committed": 0,
        "two_phase_aborted": 0,
        "two_phase_failed": 0,
        "two_phase_left_open": 0,
    }
    decisions: list[dict[str, Any]] = []
    writes: list[tuple[int, TwoPhaseCall]] = []
    for row in rows:
        x = codec.decode(b"", row["raw_value"])
        assert isinstance(x, TwoPhaseCall)
        counts["two_phase_open"] += 1
        decision = decide_obligation(x, row["through"], bool(row["done"]))
        outcome, attempts, error = "open", x.attempts, x.last_error
        if decision is None:
            counts["two_phase_left_open"] += 1
        elif dry_run:
            outcome = "dry run"
        else:
            settled = settle_obligation(
                x, decision, payload_codec, tries=tries, backoff_s=backoff_s, now_ms=now_ms
            )
            attempts, error = settled.attempts, settled.error
            if settled.entry is not None:
                writes.append((row["partition"], settled.entry))
            if settled.returned:
                outcome = "committed" if decision == "commit" else "aborted"
                counts[f"two_phase_{outcome}"] += 1
            else:
                outcome = "failed"
                counts["two_phase_failed"] += 1
        decisions.append(_decision(row["partition"], x, decision, outcome, attempts, error))
    return counts, decisions, writes


def _decision(
    partition: int,
    x: TwoPhaseCall,
    decision: Decision | None,
    outcome: str,
    attempts: int,
    error: str,
) -> dict[str, Any]:
    ref = x.ref
    return {
        "partition": partition,
        "topic": ref.topic,
        "key": ref.key,
        "seq": ref.seq,
        "action": ref.action,
        "index": x.index,
        "call_id": x.call_id,
        "function_id": x.function_id,
        "phase": x.phase.value,
        "round": x.round,
        "decision": decision or "undecided",
        "outcome": outcome,
        "attempts": attempts,
        "error": error or None,
    }
