"""Agents and actions: which function runs for which event type."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from .errors import ConfigurationError
from .events import Event

F = TypeVar("F")

_LISTENS = "__agents_stream_listens__"


def action(*event_types: type[Event]) -> Callable[[F], F]:
    """Mark an Agent staticmethod (plain or ``async``) as an action triggered by events.

    The action receives ``(event, ctx)``. Works above or below ``@staticmethod``.
    """
    if not event_types:
        raise ConfigurationError("@action needs at least one event type")
    for et in event_types:
        if not (isinstance(et, type) and issubclass(et, Event)):
            raise ConfigurationError(f"@action expects Event subclasses, got {et!r}")

    def mark(fn: F) -> F:
        target = fn.__func__ if isinstance(fn, staticmethod) else fn
        setattr(target, _LISTENS, tuple(event_types))
        return fn

    return mark


@dataclass(frozen=True)
class ActionSpec:
    name: str  # "Agent.method"
    fn: Callable[..., Any]
    listens: tuple[type[Event], ...]
    is_async: bool
    # An action whose code names the sync ctx.execute: run in a carrier, so that call
    # suspends for its ack instead of blocking the loop (durable/bridge.py). Only those:
    # the carrier costs an async action's every await a few microseconds, and a sync
    # action two greenlet switches and a carrier taken and given back per record.
    calls_sync: bool = False

    @property
    def in_carrier(self) -> bool:
        """Whether this action runs in a carrier: its code names the sync call, or one of
        its runs called it from a helper (learned, see :func:`learn_calls_sync`)."""
        return self.calls_sync or self.name in _LEARNED_SYNC


# Actions seen calling the sync ctx.execute outside a carrier (from a helper function
# their code does not name): their later runs go to a carrier. By name, as
# RunnerContext knows its action: two agents of one name in a process only cost the
# other a carrier it does not need.
_LEARNED_SYNC: set[str] = set()


def learn_calls_sync(action: str) -> None:
    """``action`` (``Agent.method``, or an action id ``Agent.method#n``) called the sync
    ``ctx.execute`` where it could not suspend: run its later records in a carrier."""
    _LEARNED_SYNC.add(action.split("#", 1)[0])


_SYNC_CALLS = frozenset({"execute", "durable_execute"})


def _names_sync_call(code: Any) -> bool:
    """Whether ``code`` (or a function, lambda or comprehension inside it) names
    ``execute`` / ``durable_execute``: ``ctx.execute(...)`` in its source."""
    if _SYNC_CALLS.intersection(code.co_names):
        return True
    return any(_names_sync_call(c) for c in code.co_consts if inspect.iscode(c))


class Agent:
    """Subclass and add ``@action`` staticmethods. Agents hold no per-instance state:
    per-key state goes through ``ctx.short_term_memory`` so it survives crashes."""

    @classmethod
    def actions(cls) -> list[ActionSpec]:
        found: list[ActionSpec] = []
        seen: set[str] = set()
        for klass in reversed(cls.__mro__):
            for attr, raw in vars(klass).items():
                fn = raw.__func__ if isinstance(raw, staticmethod | classmethod) else raw
                listens = getattr(fn, _LISTENS, None)
                if listens is None:
                    continue
                if isinstance(raw, classmethod) or not isinstance(raw, staticmethod):
                    raise ConfigurationError(
                        f"{cls.__name__}.{attr}: actions must be @staticmethod taking (event, ctx)"
                    )
                if attr in seen:
                    found = [a for a in found if a.name != f"{cls.__name__}.{attr}"]
                seen.add(attr)
                found.append(
                    ActionSpec(
                        name=f"{cls.__name__}.{attr}",
                        fn=fn,
                        listens=listens,
                        is_async=inspect.iscoroutinefunction(fn),
                        calls_sync=_names_sync_call(fn.__code__),
                    )
                )
        if not found:
            raise ConfigurationError(f"agent {cls.__name__} defines no @action")
        return found

    @classmethod
    def event_types(cls) -> dict[str, type[Event]]:
        """Every event type the agent listens to, by journal name."""
        return {et.event_name: et for spec in cls.actions() for et in spec.listens}
