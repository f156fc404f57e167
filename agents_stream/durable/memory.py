"""Short-term memory: per-key values an action reads and updates.

Updates are buffered while the action runs and applied once, atomically, when it
completes (journaled in its ActionDone and in the key's MemorySnapshot), so a crashed
action leaves no half-applied memory and a completed one is never applied twice.

Values are in the journaled value domain (:mod:`.values`, the same as call results), so
``get`` returns exactly what was ``set``, types included, in this action or any later
one after a restart; snapshots written as plain JSON by earlier versions still read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .values import decode_value, encode_value

_MISSING = object()


class ShortTermMemory:
    def __init__(
        self,
        base: dict[str, bytes] | Callable[[], dict[str, bytes]],
        guard: Callable[[str], None],
    ) -> None:
        # A loader defers reading the key's snapshot until the action touches memory.
        if callable(base):
            self._loader: Callable[[], dict[str, bytes]] | None = base
            self._base_values: dict[str, bytes] | None = None
        else:
            self._loader = None
            self._base_values = base
        self._updates: dict[str, bytes | None] = {}
        self._guard = guard

    @property
    def _base(self) -> dict[str, bytes]:
        if self._base_values is None:
            assert self._loader is not None
            self._base_values = self._loader()
        return self._base_values

    def get(self, name: str, default: Any = None) -> Any:
        self._guard("short_term_memory.get")
        raw = self._updates.get(name, _MISSING)
        if raw is _MISSING:
            raw = self._base.get(name)
        return default if raw is None else decode_value(raw)  # type: ignore[arg-type]

    def set(self, name: str, value: Any) -> None:
        self._guard("short_term_memory.set")
        # The journaled value domain, like call results: what get() returns after a
        # restart equals what was set, types included (JSON alone made a tuple a list
        # and {1: 5} {"1": 5}). Snapshots written as plain JSON still read.
        self._updates[name] = encode_value(value, where=f"short_term_memory[{name!r}]")

    def delete(self, name: str) -> None:
        self._guard("short_term_memory.delete")
        self._updates[name] = None

    def __contains__(self, name: str) -> bool:
        return self.get(name, _MISSING) is not _MISSING

    @property
    def updates(self) -> dict[str, bytes | None]:
        updates = self._updates
        return dict(updates) if updates else {}  # read after every action run, mostly empty


class KeylessMemory(ShortTermMemory):
    """The memory of a keyless record: every use raises :class:`KeylessRecordError`."""

    def __init__(self, error: Callable[[], Exception], guard: Callable[[str], None]) -> None:
        super().__init__({}, guard)
        self._error = error

    def get(self, name: str, default: Any = None) -> Any:
        raise self._error()

    def set(self, name: str, value: Any) -> None:
        raise self._error()

    def delete(self, name: str) -> None:
        raise self._error()


def apply_updates(base: dict[str, bytes], updates: dict[str, bytes | None]) -> dict[str, bytes]:
    merged = dict(base)
    for name, value in updates.items():
        if value is None:
            merged.pop(name, None)
        else:
            merged[name] = value
    return merged
