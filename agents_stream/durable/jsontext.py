"""JSON text on the hot path: orjson where its answer is the standard library's, else json.

Why: every record's input is parsed once and every output and call result written once;
``json`` spends ~2-3 us on a small record, orjson ~0.2 us. But orjson is not a drop-in:

* ``loads`` turns integers beyond 64 bits into floats, silently; it refuses ``NaN`` /
  ``Infinity``, floats that overflow and escaped lone surrogates, which ``json`` reads.
* ``dumps`` refuses integers beyond 64 bits and lone surrogates, writes nan as ``null``,
  and writes dataclasses, datetimes, UUIDs, enums and tuples that ``json`` refuses (or
  that the journal tags).

So it only gets what it answers exactly: texts without a run of 19 digits (every
integer of at most 18 digits fits in 64 bits; a longer run may just be a long string or
fraction, which only costs the fallback), and trees already known to be plain JSON
(exact ``dict``/``list``/``str``/``int``/``float``/``bool``/``None``, finite floats).
Whatever it refuses goes to ``json``, which answers (or raises) as it always did.
Floats may be spelled differently (``1e-7`` for ``1e-07``); they read back as the same
float. ``tests/unit/durable/test_jsontext.py`` holds both directions to ``json`` with
hypothesis. Without orjson installed everything goes to ``json``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

try:
    from orjson import dumps as _fast_dumps
    from orjson import loads as _fast_loads
except ImportError:  # pragma: no cover - orjson is a dependency; degrade, don't fail
    _fast_dumps = None  # type: ignore[assignment]
    _fast_loads = None  # type: ignore[assignment]

_LONG_DIGITS = re.compile(rb"[0-9]{19}")


def loads(data: bytes, errors: str = "strict") -> Any:
    """``json.loads(data.decode("utf-8", errors))``: the same value, or the same
    exception (orjson reads strict UTF-8 only; what it refuses goes to json)."""
    if _fast_loads is not None and _LONG_DIGITS.search(data) is None:
        try:
            return _fast_loads(data)
        except ValueError:  # json decides: it may read it, or raises its own error
            pass
    return json.loads(bytes(data).decode("utf-8", errors))


def dumps_plain(tree: Any) -> bytes | None:
    """Compact UTF-8 JSON of a plain tree (see the module doc), or None where orjson is
    missing or refuses it (an integer beyond 64 bits, a lone surrogate): the caller's
    json path decides then."""
    if _fast_dumps is None:
        return None
    try:
        return _fast_dumps(tree)
    except TypeError:  # orjson.JSONEncodeError
        return None


def plain_writer(fallback: Callable[[Any], str]) -> Callable[[Any], bytes]:
    """A writer of plain trees: :func:`dumps_plain`, else
    ``fallback(tree).encode("utf-8", "surrogatepass")`` (the journal keeps lone
    surrogates)."""

    def write(tree: Any) -> bytes:
        fast = dumps_plain(tree)
        return fallback(tree).encode("utf-8", "surrogatepass") if fast is None else fast

    return write
