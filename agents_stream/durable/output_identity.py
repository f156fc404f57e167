"""What an output is: the identity every host stamps on each output record it sends.

``x-agents-stream-output: <app id>/<input topic>/<partition>/<offset>/<action>/<finished
ms>/<index>``: the action that produced it (the journal identity of its input record),
when that action finished (a record reusing the offset of a recreated topic cannot
match), and which of its outputs it is. Recovery looks outputs up by it
(``host/output_log.py``); the Spark audit counts duplicates by it. Async I/O outputs,
journaled nowhere, carry ``async_io:<fn>`` and the input record's timestamp in those two
fields (``runtime/async_io.py``): the same on every run over that input.
"""

from __future__ import annotations

from .journal import ActionDone

OUTPUT_HEADER = "x-agents-stream-output"


def output_prefix(origin: str, done: ActionDone) -> str:
    """The header value of ``done``'s outputs, up to the output's index."""
    ref = done.ref
    return f"{origin}/{ref.topic}/{ref.partition}/{ref.seq}/{ref.action}/{done.finished_ms}/"
