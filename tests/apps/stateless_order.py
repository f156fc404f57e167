"""Test app: a sync action with no key state, so its records take the batch path, where
a key's next record starts once the previous one's ActionDone is acked and its outputs
are produced (before they are acked). Topics and app id come from the environment."""

from __future__ import annotations

import os
import random
import time

from agents_stream import Agent, App, InputEvent, OutputEvent, RunnerContext, action

app = App(os.environ.get("AS_APP_ID", "stateless-order"), commit_interval=0.5)


def jitter(n: int) -> int:
    time.sleep(random.random() * 0.002)
    return n


class Echo(Agent):
    @action(InputEvent)
    @staticmethod
    def process(event: InputEvent, ctx: RunnerContext) -> None:
        n = event.input["n"]
        if n % 3 == 0:  # some records journal a call, some do not
            n = ctx.execute(jitter, n)
        for part in range(2):
            ctx.send_event(OutputEvent(output={"key": event.key, "n": n, "part": part}))


app.agent(
    Echo,
    input=os.environ.get("AS_INPUT", "stateless-in"),
    output=os.environ.get("AS_OUTPUT", "stateless-out"),
)
