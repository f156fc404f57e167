"""The console's HTML: plain server-rendered pages (no JavaScript, no build step).

Every value read from a topic is escaped; journaled payloads are shown as their tagged
JSON text (what ``state show`` prints), shortened, and never unpickled.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from html import escape
from urllib.parse import quote

from ..cli.dlq import DeadLetter, describe
from ..cli.state import short_payload
from ..durable.journal import CallEntry, TwoPhaseCall
from .cluster import MetricsScraper, Overview
from .history import CallView, KeyHistory
from .journal import SettledCall, Settlement, Unreadable

_LONG = 400

# Said wherever the console tells reconciled calls apart: it is read off two values of
# the slot, and where one of them is gone nothing in the journal says it.
_SETTLED_NOTE = (
    "Who settled a PENDING call is inferred, not journaled: the console read the slot's "
    "PENDING value and then its outcome; an outcome written by another worker with the "
    "PENDING value's start time is the reconciler's (the function was not run again). "
    "Where the console never read the PENDING value (compacted away before it started) "
    "the call shows as a plain outcome, and a reconciler run by the very process that "
    "wrote PENDING (its partition given back, a restart under a fixed --worker-id) reads "
    "as that run finishing."
)

_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1d2330}
header{background:#1d2330;color:#fff;padding:.6em 1.2em;display:flex;gap:1.5em;align-items:center}
header a{color:#cfe0ff;text-decoration:none} header b{color:#fff}
main{padding:1em 1.2em} table{border-collapse:collapse;margin:.4em 0 1.2em}
th,td{border:1px solid #d5d9e2;padding:.25em .5em;text-align:left;vertical-align:top}
th{background:#f0f2f6} code,.mono{font-family:ui-monospace,monospace;font-size:12px}
.bad{background:#fde8e8} .pending{background:#fff5d6} .replayed{background:#e6f4ea}
.reconciled{background:#efe6fa}
.muted{color:#6b7280} .note{background:#eef4ff;padding:.5em .8em;border-radius:4px}
form.inline{display:inline} input[type=search]{width:22em}
"""


def text(value: object) -> str:
    return escape(str(value))


def payload(data: bytes | None, limit: int = _LONG) -> str:
    """A journaled payload as ``state show`` prints it, up to ``limit`` characters."""
    return short_payload(data, limit, "(none)")


def when(ms: int) -> str:
    if ms <= 0:
        return ""
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def table(headers: Sequence[str], rows: Iterable[tuple[str, Sequence[str]]]) -> str:
    """``rows`` as (css class, cells already escaped)."""
    head = "".join(f"<th>{text(h)}</th>" for h in headers)
    body = "".join(
        f'<tr class="{cls}">' + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"
        for cls, cells in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def layout(title: str, app_id: str, body: str, *, refresh: int = 0) -> str:
    """A page: the header with the navigation and search, then ``body``."""
    meta = f'<meta http-equiv="refresh" content="{refresh}">' if refresh > 0 else ""
    return (
        f'<!doctype html><html><head><meta charset="utf-8">{meta}'
        f"<title>{text(title)} · {text(app_id)}</title><style>{_STYLE}</style></head><body>"
        f"<header><b>agents-stream · {text(app_id)}</b>"
        '<a href="/">overview</a><a href="/pending">pending calls</a>'
        '<a href="/dlq">dead letters</a>'
        '<form class="inline" action="/search"><input type="search" name="q" '
        'placeholder="key, call id or output identity"> <button>find</button></form>'
        f"</header><main><h2>{text(title)}</h2>{body}</main></body></html>"
    )


def unreadable_rows(items: Sequence[Unreadable]) -> str:
    return table(
        ["key", "partition", "offset", "why it cannot be read"],
        (
            ("bad", [_key_link(u.key), text(u.partition), text(u.offset), text(u.reason)])
            for u in items
        ),
    )


def _key_link(key: str) -> str:
    return f'<a href="/key/{quote(key, safe="")}">{text(key)}</a>'


# -- overview ---------------------------------------------------------------------------
def overview_body(
    agents: Sequence[tuple[str, str, str]],
    journal_topic: str,
    stats: dict[str, int],
    caught_up: bool,
    journal_error: str | None,
    overview: Overview | None,
    overview_error: str,
    metrics: list[tuple[str, dict[str, float], dict[str, float], str]],
    unreadable: Sequence[Unreadable],
    two_phase: Mapping[int, int] | None = None,
) -> str:
    """``two_phase``: open two-phase obligations (commits or aborts owed) per journal
    partition (:meth:`~.journal.JournalIndex.two_phase_waiting`)."""
    parts = [
        "<h3>Agents</h3>",
        table(
            ["agent", "input", "output"],
            (("", [text(a), text(i), text(o or "-")]) for a, i, o in agents),
        ),
        f"<h3>Journal <code>{text(journal_topic)}</code></h3>",
    ]
    state = "read to its end, following" if caught_up else "reading..."
    if journal_error:
        state = f"not readable: {text(journal_error)}"
    parts.append(f"<p>{state}</p>")
    order = ("entries", "keys", "PENDING", "SUCCEEDED", "FAILED", "completed", "unreadable")
    parts.append(table(list(order), [("", [text(stats.get(k, 0)) for k in order])]))
    if unreadable:
        parts.append("<h3>Unreadable journal records</h3>" + unreadable_rows(unreadable))
    parts.append(_two_phase_waiting(two_phase or {}, stats.get("two-phase", 0)))
    parts.append("<h3>Input partitions</h3>")
    if overview is None:
        parts.append(f'<p class="bad">{text(overview_error)}</p>')
    else:
        parts.append(
            table(
                ["topic", "partition", "owner", "committed", "end", "lag"],
                (
                    (
                        "pending" if p.lag else "",
                        [
                            text(p.topic),
                            text(p.partition),
                            text(p.owner or "-"),
                            text("-" if p.committed is None else p.committed),
                            text(p.end),
                            text(p.lag),
                        ],
                    )
                    for p in overview.partitions
                ),
            )
        )
        parts += [f'<p class="bad">{text(e)}</p>' for e in overview.errors]
        parts.append("<h3>Dead letters</h3>")
        parts.append(
            table(
                ["topic", "records"],
                (
                    ("bad" if n else "", [f'<a href="/dlq">{text(t)}</a>', text(n or 0)])
                    for t, n in overview.dead_letters.items()
                ),
            )
        )
    if metrics:
        parts.append("<h3>Workers (metrics endpoints)</h3>")
        parts.append(_metrics_table(metrics))
    return "".join(parts)


def _two_phase_waiting(waiting: Mapping[int, int], obligations: int) -> str:
    """The overview's two-phase section: open obligations per partition (nothing when
    the journal holds no obligation at all)."""
    if not waiting:
        if not obligations:
            return ""
        return "<h3>Two-phase calls waiting</h3><p>None: every prepared call is settled.</p>"
    intro = (
        '<p class="note">A two-phase call waits (PREPARED or ABORTING) until the owner of '
        "its partition commits it (its record completed and is below the completed-through "
        "marker) or aborts it; a waiting record is not pruned.</p>"
    )
    rows = (("pending", [text(p), text(n)]) for p, n in waiting.items())
    return (
        f"<h3>Two-phase calls waiting ({text(sum(waiting.values()))})</h3>"
        + intro
        + table(["partition", "waiting"], rows)
    )


def _metrics_table(metrics: list[tuple[str, dict[str, float], dict[str, float], str]]) -> str:
    names = MetricsScraper.WATCHED
    rows = []
    for url, sums, rates, error in metrics:
        if error:
            rows.append(("bad", [text(url), *[""] * len(names), text(error)]))
            continue
        cells = []
        for name in names:
            value = sums.get(name)
            rate = rates.get(name)
            shown = "-" if value is None else f"{value:g}"
            if rate is not None:
                shown += f" ({rate:.1f}/s)"
            cells.append(text(shown))
        rows.append(("", [text(url), *cells, ""]))
    short = [n.removeprefix("agents_stream_") for n in names]
    return table(["endpoint", *short, "error"], rows)


# -- a key's history --------------------------------------------------------------------
def history_body(history: KeyHistory, origin: str, decode_output: object) -> str:
    parts = []
    if not history.runs and not history.unreadable and history.memory is None:
        return "<p>The journal holds nothing for this key (finished records are pruned).</p>"
    if history.unreadable:
        parts.append("<h3>Unreadable journal records</h3>" + unreadable_rows(history.unreadable))
    for run in history.runs:
        state = "in progress"
        if run.done is not None:
            state = f"completed {text(when(run.done.finished_ms))} UTC"
            if not run.done.emitted and run.done.outputs:
                state += (
                    " · outputs not marked emitted (recovery looks them up in the output topic)"
                )
        topic = f"{text(run.topic)} " if run.topic else ""
        parts.append(f"<h3>{topic}seq {text(run.seq)} · {text(run.action)} · {state}</h3>")
        two_phase = bool(run.obligations)
        parts.append(
            table(
                [
                    "#",
                    "function",
                    "args digest",
                    "status",
                    "result / exception",
                    "attempts",
                    "duration",
                    "worker",
                    "call id",
                    "replay",
                    "after PENDING",
                    *(["two-phase"] if two_phase else []),
                ],
                (_call_row(view, two_phase) for view in run.calls),
            )
        )
        orphans = run.orphan_obligations
        if orphans:
            parts.append(
                "<p>two-phase obligations whose call slot is gone:</p>"
                + table(
                    ["#", "function", "two-phase", "call id"],
                    (
                        (
                            _phase_class(x),
                            [
                                text(x.index),
                                f"<code>{text(x.function_id)}</code>",
                                _two_phase_cell(x),
                                f"<code>{text(x.call_id)}</code>",
                            ],
                        )
                        for x in orphans
                    ),
                )
            )
        for cut in run.truncations:
            parts.append(
                f'<p class="bad">truncated at call {text(cut.index)}: the action now calls '
                f"{text(cut.expected_function_id)}, the journal had "
                f"{text(cut.recorded_function_id)} ({text(cut.dropped)} slot(s) dropped)</p>"
            )
        done = run.done
        if done is not None:
            if done.memory_updates:
                updates = ", ".join(
                    f"{text(u.name)} = <code>{text(payload(u.value, 120))}</code>"
                    if u.value is not None
                    else f"{text(u.name)} deleted"
                    for u in done.memory_updates
                )
                parts.append(f"<p>memory after this action: {updates}</p>")
            if done.outputs:
                ids = run.output_identities(origin)
                parts.append(
                    table(
                        ["output identity (x-agents-stream-output)", "value", "emitted"],
                        (
                            (
                                "",
                                [
                                    f"<code>{text(ids[j])}</code>",
                                    f"<code>{text(payload(value))}</code>",
                                    text(
                                        "yes"
                                        if done.emitted or j in done.emitted_outputs
                                        else "not marked"
                                    ),
                                ],
                            )
                            for j, value in enumerate(done.outputs)
                        ),
                    )
                )
            if done.events:
                sent = ", ".join(text(e.type) for e in done.events)
                parts.append(f"<p>events sent: {sent}</p>")
    if history.memory is not None:
        values = ", ".join(
            f"{text(k)} = <code>{text(payload(v, 120))}</code>"
            for k, v in sorted(history.memory.values.items())
        )
        parts.append(
            f"<h3>Short-term memory now (after seq {text(history.memory.applied_seq)})</h3>"
            f"<p>{values or '(empty)'}</p>"
        )
    if history.timers:
        rows = (("", [text(t.kind), text(when(t.ts)), text(t.agent)]) for t in history.timers)
        parts.append("<h3>Timers</h3>" + table(["kind", "at (UTC)", "agent"], rows))
    if any(view.settled is not None for run in history.runs for view in run.calls):
        parts.append(f'<p class="muted">{text(_SETTLED_NOTE)}</p>')
    return "".join(parts)


def _settled_text(settled: Settlement | None) -> str:
    return "" if settled is None else settled.describe()


def _phase_class(x: TwoPhaseCall) -> str:
    return "pending" if x.phase.open else ""


def _two_phase_cell(x: TwoPhaseCall | None) -> str:
    """A two-phase call's phase, round, attempts and last error."""
    if x is None:
        return ""
    shown = f"<b>{text(x.phase.value)}</b> · round {text(x.round)}"
    shown += f" · {text(x.attempts)} attempt(s)"
    if x.settled_ms:
        shown += f" · settled {text(when(x.settled_ms))} UTC"
    if x.worker_id:
        shown += f" · by {text(x.worker_id)}"
    if x.last_error:
        shown += (
            f'<br><span class="muted">last error: {text(payload(x.last_error.encode()))}</span>'
        )
    return shown


def _call_row(view: CallView, two_phase: bool = False) -> tuple[str, list[str]]:
    call, replayed = view.call, view.replayed
    status = call.status.value
    if call.exception is not None:
        outcome = f"{text(call.exception.type)}: {text(payload(call.exception.message.encode()))}"
    elif call.result is not None:
        outcome = f"<code>{text(payload(call.result))}</code>"
    else:
        outcome = ""
    duration = ""
    if call.finished_ms and call.started_ms:
        duration = f"{call.finished_ms - call.started_ms} ms"
    cls = "pending" if status == "PENDING" else "bad" if status == "FAILED" else ""
    reconciled = view.settled is not None and view.settled.how == "reconciler"
    if not cls and view.obligation is not None:
        cls = _phase_class(view.obligation)
    if not cls:
        cls = "reconciled" if reconciled else "replayed" if replayed else ""
    return cls, [
        text(call.index),
        f"<code>{text(call.function_id)}</code>",
        f'<code title="{text(call.args_digest)}">{text(call.args_digest[:12])}</code>',
        text(status),
        outcome,
        text(call.attempts),
        text(duration),
        text(call.worker_id),
        f"<code>{text(call.call_id)}</code>",
        text(replayed or "no"),
        text(_settled_text(view.settled)),
        *([_two_phase_cell(view.obligation)] if two_phase else []),
    ]


# -- PENDING calls ----------------------------------------------------------------------
def pending_body(calls: Sequence[CallEntry], now_ms: int, settled: Sequence[SettledCall]) -> str:
    parts = [_open_pending(calls, now_ms)]
    if settled:
        parts.append(
            "<h3>Settled PENDING calls</h3>"
            f'<p class="note">The last {len(settled)} PENDING call(s) this console read the '
            f"outcome of, newest first. {text(_SETTLED_NOTE)}</p>"
        )
        rows = (
            (
                "reconciled" if s.settled.how == "reconciler" else "",
                [
                    _key_link(s.call.ref.key),
                    text(s.call.ref.topic),
                    text(s.call.ref.seq),
                    text(s.call.ref.action),
                    text(s.call.index),
                    f"<code>{text(s.call.function_id)}</code>",
                    text(s.call.status.value),
                    text(when(s.call.started_ms)),
                    text(when(s.call.finished_ms)),
                    text(s.settled.describe()),
                ],
            )
            for s in settled
        )
        headers = ["key", "topic", "seq", "action", "#", "function", "status",
                   "started (UTC)", "finished (UTC)", "settled"]  # fmt: skip
        parts.append(table(headers, rows))
    return "".join(parts)


def _open_pending(calls: Sequence[CallEntry], now_ms: int) -> str:
    if not calls:
        return "<p>No PENDING call: every reconcilable call that started has finished.</p>"
    intro = (
        '<p class="note">A PENDING call was journaled before its function started and has '
        "no outcome yet. When its record runs again (a restart, a rebalance) the "
        "reconciler given with the call is asked for the outcome, with the call id "
        "below; the function is never run again.</p>"
    )
    rows = (
        (
            "pending",
            [
                _key_link(c.ref.key),
                text(c.ref.topic),
                text(c.ref.seq),
                text(c.ref.action),
                text(c.index),
                f"<code>{text(c.function_id)}</code>",
                text(when(c.started_ms)),
                text(_age(now_ms - c.started_ms)),
                text(c.attempts),
                text(c.worker_id),
                f"reconciler of <code>{text(c.function_id)}</code> for "
                f"<code>{text(c.call_id)}</code>",
            ],
        )
        for c in calls
    )
    headers = ["key", "topic", "seq", "action", "#", "function", "started (UTC)", "age",
               "attempts", "worker", "on recovery"]  # fmt: skip
    return intro + table(headers, rows)


def _age(ms: int) -> str:
    seconds = max(0, ms // 1000)
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h"


# -- dead letters -----------------------------------------------------------------------
def dlq_body(
    letters: dict[str, list[DeadLetter] | str], allow_replay: bool, token: str, message: str
) -> str:
    parts = [f'<p class="note">{text(message)}</p>'] if message else []
    if not allow_replay:
        parts.append(
            '<p class="muted">Read-only: start the console with --allow-replay to replay '
            "dead letters from here.</p>"
        )
    for dlq, found in letters.items():
        parts.append(f"<h3><code>{text(dlq)}</code></h3>")
        if isinstance(found, str):
            parts.append(f'<p class="muted">{text(found)}</p>')
            continue
        if not found:
            parts.append("<p>empty</p>")
            continue
        if allow_replay:
            parts.append(_replay_form(dlq, "", token, f"replay all {len(found)}"))
        rows = []
        for letter in found:
            info = describe(letter)
            source = letter.source
            cells = [
                text(f"{letter.dlq_partition}:{letter.dlq_offset}"),
                text(f"{source[0]}[{source[1]}]@{source[2]}" if source else "?"),
                _key_link(info["key"]) if info["key"] is not None else "",
                text(info["stage"]),
                text(info["error_type"]),
                text(payload(info["error_message"].encode(), 300)),
                text(info["failed_at_ms"]),
                text("yes" if info["replay_of"] else ""),
            ]
            if allow_replay and source is not None:
                position = f"{letter.dlq_partition}:{letter.dlq_offset}"
                cells.append(_replay_form(dlq, position, token, "replay"))
            rows.append(("bad", cells))
        headers = ["dlq position", "source", "key", "stage", "error", "message",
                   "failed at (ms)", "a replay"]  # fmt: skip
        parts.append(table(headers + ([""] if allow_replay else []), rows))
    return "".join(parts)


def _replay_form(dlq: str, position: str, token: str, label: str) -> str:
    return (
        '<form class="inline" method="post" action="/dlq/replay">'
        f'<input type="hidden" name="dlq" value="{text(dlq)}">'
        f'<input type="hidden" name="position" value="{text(position)}">'
        f'<input type="hidden" name="token" value="{text(token)}">'
        f"<button>{text(label)}</button></form>"
    )
