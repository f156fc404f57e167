"""How a call is recognised on replay: function id, canonical args digest, call_id.

The digest must be identical in every process and every run, so it is computed from a
canonical encoding (sorted keys, no ``hash()``, no memory addresses), never from
``repr`` of arbitrary objects.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import inspect
import json
from collections.abc import Callable, Mapping
from typing import Any


def function_id(fn: Callable[..., Any]) -> str:
    """``module.QualName`` of ``fn``; a DurableCallable's ``id`` or ``__durable_id__`` wins."""
    explicit = getattr(fn, "__durable_id__", None)
    if explicit:
        return str(explicit)
    target = getattr(fn, "func", fn)  # functools.partial
    module = getattr(target, "__module__", None) or type(target).__module__
    qualname = getattr(target, "__qualname__", None) or type(target).__qualname__
    return f"{module}.{qualname}"


def _canonical(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, bytes | bytearray):
        return {"__bytes__": bytes(value).hex()}
    if isinstance(value, enum.Enum):
        return {"__enum__": f"{type(value).__qualname__}.{value.name}"}
    if isinstance(value, Mapping):
        return {"__map__": sorted([_canonical(k), _canonical(v)] for k, v in value.items())}
    if isinstance(value, list | tuple):
        return [_canonical(v) for v in value]
    if isinstance(value, set | frozenset):
        return {"__set__": sorted(json.dumps(_canonical(v), sort_keys=True) for v in value)}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: _canonical(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return {"__dc__": type(value).__qualname__, **fields}
    # Opaque objects contribute only their type: their repr may hold a memory address,
    # which would make every replay look like a mismatch.
    return {"__type__": f"{type(value).__module__}.{type(value).__qualname__}"}


def args_digest(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str:
    """Stable hex digest of call arguments (first 16 bytes of SHA-256)."""
    encoded = json.dumps(
        [_canonical(list(args)), _canonical(dict(kwargs))], sort_keys=True, separators=(",", ":")
    )
    return hashlib.sha256(encoded.encode()).hexdigest()[:32]


def wants_call_id(fn: Callable[..., Any]) -> bool:
    """True when ``fn``'s first parameter is named ``call_id`` (it then gets the id)."""
    func = getattr(fn, "__func__", None)  # bound method: look at the plain function
    try:
        if func is not None:
            return _first_param(func, skip=1) == "call_id"
        return _first_param(fn, skip=0) == "call_id"
    except TypeError:  # unhashable callable object: no caching
        return _first_param.__wrapped__(fn, 0) == "call_id"


@functools.lru_cache(maxsize=4096)
def _first_param(fn: Callable[..., Any], skip: int) -> str | None:
    # Cached: inspect.signature costs more than the rest of a journaled call's setup.
    try:
        params = list(inspect.signature(fn).parameters.values())[skip:]
    except (TypeError, ValueError):
        return None
    return params[0].name if params else None
