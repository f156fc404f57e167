"""A key's history as the console shows it: its journal entries grouped into action runs.

The journal records executions, not replays (a replay writes nothing), so whether a
later run replayed a call is read from who wrote the run's calls: a call followed, in
the same action run, by a call another worker (host-pid) wrote was returned from the
journal to that later worker -- replayed. The calls of a run still in progress will be
replayed by its next run. Whether a reconciler settled a call is the index's inference
from the slot's PENDING value (:func:`agents_stream.console.journal.settlement`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..durable.journal import (
    ActionDone,
    CallEntry,
    MemorySnapshot,
    TimerEntry,
    Truncation,
    TwoPhaseCall,
    action_ordinal,
)
from ..durable.output_identity import output_prefix
from .journal import Located, Settlement, Unreadable

RunId = tuple[str, int, str]  # (input topic, seq, action)


@dataclass
class CallView:
    call: CallEntry
    partition: int
    offset: int
    # "" (not known to be), or who replayed it / that the next run will
    replayed: str = ""
    # how its PENDING value (when the console read one) was settled
    settled: Settlement | None = None
    # a two-phase call's obligation (v8): its phase, round, attempts, last error
    obligation: TwoPhaseCall | None = None


@dataclass
class RunView:
    topic: str
    seq: int
    action: str
    calls: list[CallView] = field(default_factory=list)
    done: ActionDone | None = None
    truncations: list[Truncation] = field(default_factory=list)
    # two-phase obligations by call index; those of calls in ``calls`` are also on them
    obligations: dict[int, TwoPhaseCall] = field(default_factory=dict)

    @property
    def orphan_obligations(self) -> list[TwoPhaseCall]:
        """Obligations whose call slot is gone (pruned, or compacted away)."""
        slots = {view.call.index for view in self.calls}
        return [x for i, x in sorted(self.obligations.items()) if i not in slots]

    def output_identities(self, origin: str) -> list[str]:
        if self.done is None:
            return []
        prefix = output_prefix(origin, self.done)
        return [f"{prefix}{j}" for j in range(len(self.done.outputs))]


@dataclass
class KeyHistory:
    key: str
    runs: list[RunView]
    memory: MemorySnapshot | None
    timers: list[TimerEntry]
    unreadable: list[Unreadable]


def key_history(key: str, items: list[Located | Unreadable]) -> KeyHistory:
    """``key``'s entries as runs by (topic, seq, action ordinal), calls by index."""
    runs: dict[RunId, RunView] = {}
    memory: MemorySnapshot | None = None
    timers: list[TimerEntry] = []
    unreadable: list[Unreadable] = []

    def run_of(topic: str, seq: int, action: str) -> RunView:
        found = runs.get((topic, seq, action))
        if found is None:
            found = runs[(topic, seq, action)] = RunView(topic, seq, action)
        return found

    for item in items:
        if isinstance(item, Unreadable):
            unreadable.append(item)
            continue
        entry = item.entry
        if isinstance(entry, CallEntry):
            ref = entry.ref
            run_of(ref.topic, ref.seq, ref.action).calls.append(
                CallView(entry, item.partition, item.offset, settled=item.settled)
            )
        elif isinstance(entry, ActionDone):
            run_of(entry.ref.topic, entry.ref.seq, entry.ref.action).done = entry
        elif isinstance(entry, Truncation):
            run_of(entry.ref.topic, entry.ref.seq, entry.ref.action).truncations.append(entry)
        elif isinstance(entry, TwoPhaseCall):
            run_of(entry.ref.topic, entry.ref.seq, entry.ref.action).obligations[entry.index] = (
                entry
            )
        elif isinstance(entry, MemorySnapshot):
            memory = entry
        elif isinstance(entry, TimerEntry):
            timers.append(entry)
    ordered = sorted(runs.values(), key=lambda r: (r.topic, r.seq, action_ordinal(r.action)))
    for run in ordered:
        run.calls.sort(key=lambda c: c.call.index)
        for view in run.calls:
            view.obligation = run.obligations.get(view.call.index)
        _mark_replays(run)
    unreadable.sort(key=lambda u: (u.partition, u.offset))
    return KeyHistory(key, ordered, memory, sorted(timers, key=lambda t: t.ts), unreadable)


def _mark_replays(run: RunView) -> None:
    """Mark the terminal calls a later run returned from the journal (see module doc)."""
    calls = run.calls
    for i, view in enumerate(calls):
        if not view.call.status.terminal:
            continue
        writer = view.call.worker_id
        later = next((c.call.worker_id for c in calls[i + 1 :]
                      if c.call.worker_id and c.call.worker_id != writer), "")  # fmt: skip
        if later:
            view.replayed = f"replayed by {later}"
        elif run.done is None:
            view.replayed = "to be replayed by the next run"
