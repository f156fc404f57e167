"""Journaled exceptions: what is recorded of a call's exception, and how replay
rebuilds an equivalent one without pickle and without importing anything."""

from __future__ import annotations

import traceback
from typing import Any

from .errors import DurableCallError, UnsupportedValueError
from .journal import ExceptionInfo
from .values import decode_value, encode_value, lookup_loaded

_TRACEBACK_CHARS = 4000


def exception_info(exc: BaseException, *, max_bytes: int) -> ExceptionInfo:
    """What is journaled of a call's exception: class, message, traceback tail, and the
    constructor arguments (when they are in the value domain) to rebuild it exactly."""
    cls = type(exc)
    try:
        message = str(exc)
    except Exception:  # a broken __str__ must not lose the outcome
        message = f"<unprintable {cls.__qualname__}>"
    tb = "".join(traceback.format_exception(exc))[-_TRACEBACK_CHARS:]
    args = _constructor_args(exc)
    budget = max_bytes - len(tb.encode("utf-8", "replace"))
    size = len(message.encode("utf-8", "replace"))
    if args is not None and len(args) + size > budget:
        args = None  # rebuilt from the message instead: still better than no record
    if size > budget:
        message = message[: max(0, budget) // 4] + " ... [truncated for the journal]"
    return ExceptionInfo(f"{cls.__module__}.{cls.__qualname__}", message, tb, args)


def _constructor_args(exc: BaseException) -> bytes | None:
    ctor: tuple[Any, ...] = exc.args
    named = isinstance(exc, OSError) and (exc.filename, exc.filename2) != (None, None)
    if named and len(ctor) == 2:
        # OSError keeps filenames out of .args; its constructor takes them 3rd and 5th.
        ctor = (*ctor, exc.filename, None, exc.filename2)  # type: ignore[attr-defined]
    try:
        return encode_value(tuple(ctor), where="exception args")
    except UnsupportedValueError:
        return None


def _exception_class(name: str) -> type[Exception] | None:
    # Only already-imported modules: journal data must not make the worker import (and
    # so run) arbitrary modules. "a.b.Outer.Inner" does not say where the module name
    # ends, so try the longest imported prefix first.
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        obj = lookup_loaded(".".join(parts[:cut]), ".".join(parts[cut:]))
        if obj is not None:
            return obj if issubclass(obj, Exception) else None
    return None


def rebuild_exception(info: ExceptionInfo) -> BaseException:
    """An exception equivalent to the journaled one.

    The original class, when already imported, called with the journaled constructor
    arguments (entries written before schema v5 have none: called with the message).
    Otherwise, or when that constructor call fails or builds an exception with another
    message, :class:`DurableCallError` carrying the original class name and message.

    Raises:
        ValueError: the journaled arguments cannot be decoded (the journal is corrupt).
    """
    cls = _exception_class(info.type)
    if cls is not None:
        ctor = (info.message,) if info.args is None else decode_value(info.args)
        if not isinstance(ctor, tuple):
            raise ValueError(f"exception args decode to {type(ctor).__name__}, not a tuple")
        exc: Exception | None
        try:
            exc = cls(*ctor)
            # Constructor args that are not exc.args (a class formatting its own message)
            # rebuild something else: only an exception that prints the same is equivalent.
            if info.args is not None and str(exc) != info.message:
                exc = None
        except Exception:
            exc = None
        if isinstance(exc, cls):
            exc.__notes__ = [f"replayed from journal; original traceback:\n{info.traceback}"]
            return exc
    return DurableCallError(info.type, info.message, info.traceback)
