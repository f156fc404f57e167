"""Test app: durable timers. Topics and app id come from the environment.

Input values: ``{"processing": ts}`` / ``{"event": ts}`` register a timer at ``ts`` (epoch
ms) for the record's key; anything else only moves event time. Every input is echoed
(``{"seen": ...}``) once its action completed (so its timers are durable), and every
firing emits ``{"fired": kind, "ts": ..., "at": wall clock ms of the firing}``.
"""

from __future__ import annotations

import os
import time

from agents_stream import Agent, App, InputEvent, OutputEvent, RunnerContext, TimerEvent, action

app = App(
    os.environ.get("AS_APP_ID", "timers"),
    commit_interval=0.5,
    out_of_orderness_ms=0,
    idle_timeout_ms=None,
)


def now_ms() -> int:
    return int(time.time() * 1000)


class Reminders(Agent):
    @action(InputEvent)
    @staticmethod
    def schedule(event: InputEvent, ctx: RunnerContext) -> None:
        value = event.input
        if "processing" in value:
            ctx.timers.register_processing_time(value["processing"])
        if "event" in value:
            ctx.timers.register_event_time(value["event"])
        ctx.send_event(OutputEvent(output={"key": event.key, "seen": value}))

    @action(TimerEvent)
    @staticmethod
    def fire(event: TimerEvent, ctx: RunnerContext) -> None:
        at = ctx.execute(now_ms)
        ctx.send_event(
            OutputEvent(
                output={
                    "key": event.key,
                    "fired": event.kind,
                    "ts": event.timestamp,
                    "at": at,
                    "pid": os.getpid(),
                }
            )
        )


app.agent(
    Reminders,
    input=os.environ.get("AS_INPUT", "timers-in"),
    output=os.environ.get("AS_OUTPUT", "timers-out"),
)
