"""Short-term memory: per-key values an action reads and updates.

Updates are buffered while the action runs and applied once, atomically, when it
completes (journaled in its ActionDone and in the key's MemorySnapshot), so a crashed
action leaves no half-applied memory and a completed one is never applied twice.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from .errors import CodeBlockViolation

_MISSING = object()


class ShortTermMemory:
    def __init__(self, base: dict[str, bytes], guard: Callable[[str], None]) -> None:
        self._base = base
        self._updates: dict[str, bytes | None] = {}
        self._guard = guard

    def get(self, name: str, default: Any = None) -> Any:
        self._guard("short_term_memory.get")
        raw = self._updates.get(name, _MISSING)
        if raw is _MISSING:
            raw = self._base.get(name)
        return default if raw is None else json.loads(raw)  # type: ignore[arg-type]

    def set(self, name: str, value: Any) -> None:
        self._guard("short_term_memory.set")
        try:
            self._updates[name] = json.dumps(value, separators=(",", ":")).encode()
        except TypeError as exc:
            raise CodeBlockViolation(f"memory value for {name!r} is not JSON: {exc}") from exc

    def delete(self, name: str) -> None:
        self._guard("short_term_memory.delete")
        self._updates[name] = None

    def __contains__(self, name: str) -> bool:
        return self.get(name, _MISSING) is not _MISSING

    @property
    def updates(self) -> dict[str, bytes | None]:
        return dict(self._updates)


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
