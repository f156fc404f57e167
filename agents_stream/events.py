"""Events that trigger actions.

Every event belongs to one input record and one key. ``InputEvent`` wraps the decoded
input value; ``OutputEvent`` is sent to the agent's output topic; any other ``Event``
subclass (a dataclass) triggers the actions that listen for it, for the same key and
input record. Custom events are journaled as JSON of their fields and rebuilt only as
types the app registered, so a topic writer can never make a worker construct (or import)
an arbitrary class.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .errors import AgentsStreamError


class EventError(AgentsStreamError):
    """An event could not be encoded or rebuilt."""


@dataclass
class Event:
    """Base of all events. Subclass it as a ``@dataclass`` with JSON-serializable fields."""

    event_name: ClassVar[str] = ""
    _registry: ClassVar[dict[str, type[Event]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not cls.__dict__.get("event_name"):
            cls.event_name = f"{cls.__module__}.{cls.__qualname__}"
        Event._registry[cls.event_name] = cls

    @staticmethod
    def lookup(name: str) -> type[Event] | None:
        """An event class already defined in this process (never imported on demand)."""
        return Event._registry.get(name)

    def to_payload(self) -> bytes:
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        try:
            return json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()
        except TypeError as exc:
            raise EventError(f"{type(self).__name__} has a field that is not JSON: {exc}") from exc

    @classmethod
    def from_payload(cls, payload: bytes) -> Event:
        return cls(**json.loads(payload))


@dataclass
class InputEvent(Event):
    """The record that arrived: ``input`` is the decoded value, ``key`` the record key."""

    event_name: ClassVar[str] = "InputEvent"
    input: Any = None
    key: str = ""
    partition: int = 0
    offset: int = -1
    timestamp: int | None = None
    headers: dict[str, bytes] = field(default_factory=dict, repr=False)

    def to_payload(self) -> bytes:  # pragma: no cover - the input itself is the journal
        raise EventError("InputEvent is rebuilt from the input record, never journaled")


@dataclass
class OutputEvent(Event):
    """Send ``output`` to the agent's output topic, keyed by the input record's key."""

    event_name: ClassVar[str] = "OutputEvent"
    output: Any = None


@dataclass
class TimerEvent(Event):
    """A timer registered with ``ctx.timers`` fired for ``key``.

    ``kind`` is ``"event"`` (fired once the input's watermark passed ``timestamp``) or
    ``"processing"`` (fired once the worker's wall clock passed it); ``timestamp`` is the
    registered time in epoch milliseconds. Actions triggered by it run in the key's place
    in line (never concurrently with the key's records), exactly once to completion, and
    their code blocks replay after a crash like those of an input record.
    """

    event_name: ClassVar[str] = "TimerEvent"
    kind: str = "processing"
    timestamp: int = 0
    key: str = ""


Event.event_name = "Event"
