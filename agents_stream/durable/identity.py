"""How a call is recognised on replay: function id, canonical args digest, call_id.

The digest must be identical in every process and every run and must see every value,
so it is the SHA-256 of the canonical value encoding of :mod:`.values` (sorted keys, no
``hash()``, no memory addresses), never of ``repr`` of arbitrary objects.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import inspect
import json
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from .values import canonical_bytes


def function_id(fn: Callable[..., Any]) -> str:
    """``module.QualName`` of ``fn``; a DurableCallable's ``id`` or ``__durable_id__`` wins."""
    explicit = getattr(fn, "__durable_id__", None)
    if explicit:
        return str(explicit)
    target = getattr(fn, "func", fn)  # functools.partial
    module = getattr(target, "__module__", None) or type(target).__module__
    qualname = getattr(target, "__qualname__", None) or type(target).__qualname__
    return f"{module}.{qualname}"


def args_digest(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str:
    """SHA-256 (64 hex digits) of the arguments' canonical value encoding.

    Computed from values (see :mod:`.values`), so any changed argument changes it; an
    argument outside the journaled value domain raises UnsupportedValueError, before
    anything is journaled or run.
    """
    # Encoded apart so a refusal names args[i] / kwargs['k']; JSON text never holds a
    # raw NUL, so the separator keeps the pair unambiguous.
    encoded = canonical_bytes(tuple(args), where="args")
    # No keywords (most calls) always encode as ``{}``.
    encoded += b"\x00" + (canonical_bytes(dict(kwargs), where="kwargs") if kwargs else b"{}")
    return hashlib.sha256(encoded).hexdigest()


LEGACY_DIGEST_LEN = 32


def legacy_args_digest(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str:
    """The digest journals held before values were digested (32 hex digits).

    Only compared against slots that carry a 32-digit digest, so actions in flight
    across the upgrade replay their acknowledged calls instead of re-running them. It
    is blind to the value of opaque objects (datetime, Decimal...), which is why new
    slots never use it.
    """
    encoded = json.dumps(
        [_legacy(list(args)), _legacy(dict(kwargs))], sort_keys=True, separators=(",", ":")
    )
    return hashlib.sha256(encoded.encode()).hexdigest()[:LEGACY_DIGEST_LEN]


def _legacy(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, bytes | bytearray):
        return {"__bytes__": bytes(value).hex()}
    if isinstance(value, enum.Enum):
        return {"__enum__": f"{type(value).__qualname__}.{value.name}"}
    if isinstance(value, Mapping):
        return {"__map__": sorted([_legacy(k), _legacy(v)] for k, v in value.items())}
    if isinstance(value, list | tuple):
        return [_legacy(v) for v in value]
    if isinstance(value, set | frozenset):
        return {"__set__": sorted(json.dumps(_legacy(v), sort_keys=True) for v in value)}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: _legacy(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return {"__dc__": type(value).__qualname__, **fields}
    return {"__type__": f"{type(value).__module__}.{type(value).__qualname__}"}


# -- how a callable takes a call ------------------------------------------------------
CallIdMode = Literal["", "positional", "keyword"]


@dataclass(frozen=True)
class CallShape:
    """How a callable is invoked: whether (and how) it receives ``call_id``, and its
    signature, used to reject a call that cannot bind before anything is journaled."""

    call_id: CallIdMode
    signature: inspect.Signature | None  # None: not introspectable, not checked
    # (fewest, most) positional arguments that bind when no keywords are passed; None
    # when the signature is not that simple. Binding costs ~10 us per call: the common
    # all-positional call is checked by counting instead.
    positional: tuple[int, int] | None = None

    def bind_error(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> TypeError | None:
        """The TypeError calling with ``args``/``kwargs`` would raise, else None."""
        if self.signature is None:
            return None
        if not kwargs and self.positional is not None:
            fewest, most = self.positional
            if fewest <= len(args) <= most:
                return None
        try:
            if self.call_id == "positional":
                self.signature.bind(None, *args, **kwargs)
            elif self.call_id == "keyword":
                self.signature.bind(*args, **kwargs, call_id=None)
            else:
                self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            return exc
        return None

    def arguments(
        self, call_id: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        if self.call_id == "positional":
            return (call_id, *args), kwargs
        if self.call_id == "keyword":
            return args, {**kwargs, "call_id": call_id}
        return args, kwargs


def call_shape(fn: Callable[..., Any]) -> CallShape:
    """The :class:`CallShape` of ``fn``, cached (signatures are costly on the hot path).

    Functions are cached by what fixes their signature (code object, which parameters
    have defaults), so a lambda or ``functools.partial`` made per call (typical for
    reconcilers) hits the cache instead of filling it and keeping its closure alive.
    """
    key = _shape_key(fn)
    if key is None:
        try:
            return _shape_by_object(fn)
        except TypeError:  # unhashable callable object: no caching
            return _shape_of(fn)
    shape = _BY_KEY.get(key)
    if shape is None:
        if len(_BY_KEY) > 4096:
            _BY_KEY.clear()
        shape = _BY_KEY[key] = _shape_of(fn)
    return shape


_BY_KEY: dict[tuple[Any, ...], CallShape] = {}


def _shape_key(fn: Any) -> tuple[Any, ...] | None:
    if hasattr(fn, "__signature__") or hasattr(fn, "__wrapped__"):
        return None
    if type(fn) is types.FunctionType:
        return ("f", fn.__code__, len(fn.__defaults__ or ()), tuple(fn.__kwdefaults__ or ()))
    if type(fn) is types.MethodType:
        inner = _shape_key(fn.__func__)
        return None if inner is None else ("m", inner)
    if type(fn) is functools.partial:
        inner = _shape_key(fn.func)
        return None if inner is None else ("p", inner, len(fn.args), tuple(fn.keywords))
    return None


@functools.lru_cache(maxsize=1024)
def _shape_by_object(fn: Callable[..., Any]) -> CallShape:
    return _shape_of(fn)


def _shape_of(fn: Callable[..., Any]) -> CallShape:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return CallShape("", None)
    params = list(sig.parameters.values())
    mode: CallIdMode = ""
    if params and params[0].name == "call_id" and params[0].kind in _POSITIONAL:
        mode = "positional"
    elif any(p.name == "call_id" and p.kind is p.KEYWORD_ONLY for p in params):
        mode = "keyword"
    return CallShape(mode, sig, _positional_range(params, mode))


def _positional_range(params: list[inspect.Parameter], mode: CallIdMode) -> tuple[int, int] | None:
    if mode == "positional":
        params = params[1:]
    fewest = most = 0
    for p in params:
        if p.kind in _POSITIONAL:
            most += 1
            fewest += p.default is p.empty
        elif p.kind is p.KEYWORD_ONLY and (p.default is not p.empty or p.name == "call_id"):
            continue
        else:  # *args, **kwargs or a required keyword-only parameter: bind() decides
            return None
    return fewest, most


_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def wants_call_id(fn: Callable[..., Any]) -> bool:
    """True when ``fn`` takes ``call_id`` (first or keyword-only parameter)."""
    return call_shape(fn).call_id != ""


def reconciler_form(
    reconciler: Callable[..., Any], fid: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[CallShape, bool]:
    """The reconciler's shape and whether it takes the call's arguments.

    Decided once, when the call is made: a recovery must not be the first time the
    reconciler is called, because a reconciler that cannot be called there would turn
    the slot into a journaled failure forever.
    """
    shape = call_shape(reconciler)
    if shape.bind_error(args, kwargs) is None:
        return shape, True
    if shape.bind_error((), {}) is None:
        return shape, False
    raise TypeError(
        f"the reconciler {function_id(reconciler)}{shape.signature} of {fid} must take no "
        "arguments or the call's own arguments (either optionally after a call_id "
        "parameter); nothing was journaled or run"
    )
