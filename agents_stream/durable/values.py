"""The journaled value domain: what a code block's arguments, result and exception args
may be, and its lossless, canonical encoding.

A replayed value must be the value the action saw the first time, types included
(``{1: 5}`` stays ``{1: 5}``, ``(1, 2)`` stays a tuple, a ``Decimal`` stays a
``Decimal``), and the args digest must change whenever any argument does. Both come
from one tagged JSON encoding:

===============================  ===============================================
value                            encoded as
===============================  ===============================================
``None``, ``bool``, ``int``,     themselves (``1``, ``1.0`` and ``True`` stay
``str``, finite ``float``        distinct; ``-0.0`` keeps its sign; ints too long
                                 for JSON number parsing as ``{"$int": hex}``)
nan / inf / -inf                 ``{"$f": "nan"}`` (every nan is the same value)
``list``                         a JSON array
``tuple``                        ``{"$t": [...]}``
``dict``                         a JSON object when every key is a ``str`` not
                                 starting with ``$``; else ``{"$d": [[k, v], ...]}``
                                 (keys: any hashable value of the domain)
``set`` / ``frozenset``          ``{"$set": [...]}`` / ``{"$fset": [...]}``
``bytes``                        ``{"$b": base64}``
``datetime`` / ``date`` /        ISO text plus fold and time zone (fixed offsets
``time`` / ``timedelta``         and ``zoneinfo.ZoneInfo`` only)
``Decimal``, ``UUID``            their exact text
dataclass instance, ``Enum``     ``{"$dc": [class, {field: value}]}`` /
member                           ``{"$enum": [class, value]}``
registered type                  ``{"$x": [name, encoded value]}``
===============================  ===============================================

Types are matched exactly (a ``str`` subclass is not a ``str``), so nothing comes back
as its base class. Anything else raises :class:`UnsupportedValueError` when the value
is encoded, i.e. when the call is made (arguments) or before its result is journaled,
never at replay.

Classes named by journal data are never imported and never unpickled: a dataclass or
enum is rebuilt only from a class registered with :func:`register_type` /
:func:`register_codec`, or found (as ``module:QualName``) in a module this process has
already imported, and only if it really is a dataclass / Enum there.

Stored bytes start with :data:`MAGIC` (``0x1e``, which no JSON text starts with) and a
format version, so journals written before this encoding (plain JSON) stay readable.
The digest encoding is the same with dict entries and object keys sorted, so equal
values digest equally in every process (no ``hash()``, no addresses, no set order).
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import hashlib
import json
import math
import sys
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping
from datetime import date, datetime, time, timedelta, timezone, tzinfo
from decimal import Decimal
from typing import Any

from .errors import UnsupportedValueError
from .jsontext import dumps_plain, loads, plain_writer

MAGIC = b"\x1e"
VERSION = b"\x01"
_HEADER = MAGIC + VERSION

_Encoder = Callable[[Any, bool], Any]


@dataclasses.dataclass(frozen=True)
class _Registered:
    cls: type
    name: str
    encode: Callable[[Any], Any] | None  # None: dataclass / enum encoded structurally
    decode: Callable[[Any], Any] | None


class TypeRegistry:
    """Classes the journal may name. Thread-safe; one process-wide default."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_cls: dict[type, _Registered] = {}
        self._by_name: dict[str, _Registered] = {}

    def register_codec(
        self,
        cls: type,
        name: str,
        encode: Callable[[Any], Any],
        decode: Callable[[Any], Any],
    ) -> None:
        """Journal instances of exactly ``cls`` as ``encode(obj)`` (a domain value) under
        ``name``; replay rebuilds them with ``decode(value)``."""
        if cls in _BUILTIN:
            raise ValueError(f"{cls.__name__} is already in the journaled value domain")
        self._add(_Registered(cls, name, encode, decode))

    def register_type(self, cls: type, name: str | None = None) -> None:
        """Give a dataclass or Enum a stable journal name (default ``module:QualName``),
        so replay finds it even before its module is imported and after it moves."""
        if not (dataclasses.is_dataclass(cls) or issubclass(cls, enum.Enum)):
            raise TypeError(f"{cls!r} is not a dataclass or Enum; use register_codec")
        self._add(_Registered(cls, name or _class_name(cls), None, None))

    def _add(self, reg: _Registered) -> None:
        if not reg.name or not isinstance(reg.name, str):
            raise ValueError("a registered type needs a non-empty str name")
        with self._lock:
            known = self._by_name.get(reg.name)
            if known is not None and known.cls is not reg.cls:
                raise ValueError(f"journal type name {reg.name!r} is taken by {known.cls!r}")
            old = self._by_cls.get(reg.cls)
            if old is not None and old.name != reg.name:
                del self._by_name[old.name]
            self._by_cls[reg.cls] = reg
            self._by_name[reg.name] = reg

    def by_cls(self, cls: type) -> _Registered | None:
        return self._by_cls.get(cls)

    def by_name(self, name: str) -> _Registered | None:
        return self._by_name.get(name)


REGISTRY = TypeRegistry()
register_codec = REGISTRY.register_codec
register_type = REGISTRY.register_type


# -- encoding ---------------------------------------------------------------------------
class _At(Exception):
    """Unwinds an unsupported value to the top, collecting the path on the way."""

    def __init__(self, cls: type, detail: str = "") -> None:
        self.cls, self.detail = cls, detail
        self.path: list[str] = []


def _class_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _find_class(name: str) -> Any:
    """The class ``module:QualName`` if its module is already imported (never imports)."""
    module_name, sep, qualname = name.partition(":")
    return lookup_loaded(module_name, qualname) if sep else None


def lookup_loaded(module_name: str, qualname: str) -> type | None:
    """The class ``qualname`` of module ``module_name`` if that module is already
    imported. Reads namespaces directly: ``getattr`` could run a module's lazy-import
    ``__getattr__`` or a descriptor on behalf of journal data."""
    obj: Any = sys.modules.get(module_name)
    for part in qualname.split(".") if obj is not None else ():
        namespace = getattr(obj, "__dict__", None)
        obj = namespace.get(part) if isinstance(namespace, Mapping) else None
    return obj if isinstance(obj, type) else None


def _journal_name(cls: type) -> str:
    reg = REGISTRY.by_cls(cls)
    if reg is not None:
        return reg.name
    name = _class_name(cls)
    if _find_class(name) is not cls:
        # Replay would not find it (a local or dynamically made class): refuse now.
        raise _At(cls, "the class is not reachable as module:QualName; register_type() it")
    return name


_JSON_INT_BITS = 12_000  # ~3,600 digits: under int/str conversion limits (4,300 digits)


def _enc_int(v: int, canon: bool) -> Any:
    if v.bit_length() <= _JSON_INT_BITS:
        return v
    return {"$int": format(v, "x")}


def _enc_float(v: float, canon: bool) -> Any:
    if math.isfinite(v):
        return v
    return {"$f": "nan" if v != v else ("inf" if v > 0 else "-inf")}


def _enc_list(v: list[Any], canon: bool) -> Any:
    out = []
    for i, item in enumerate(v):
        try:
            out.append(_enc(item, canon))
        except _At as at:
            at.path.append(f"[{i}]")
            raise
    return out


def _enc_tuple(v: tuple[Any, ...], canon: bool) -> Any:
    return {"$t": _enc_list(v, canon)}  # type: ignore[arg-type]


def _enc_dict(v: dict[Any, Any], canon: bool) -> Any:
    if all(type(k) is str and not k.startswith("$") for k in v):
        out = {}
        for k, item in v.items():
            try:
                out[k] = _enc(item, canon)
            except _At as at:
                at.path.append(f"[{k!r}]")
                raise
        return out  # json.dumps(sort_keys=True) orders it for digests
    pairs = []
    for k, item in v.items():
        try:
            pairs.append([_enc(k, canon), _enc(item, canon)])
        except _At as at:
            at.path.append(f"[{k!r}]")
            raise
    if canon:
        pairs.sort(key=lambda p: _text(p[0], True))
    return {"$d": pairs}


def _enc_set(v: set[Any] | frozenset[Any], canon: bool) -> Any:
    items = []
    for item in v:
        try:
            items.append(_enc(item, True))
        except _At as at:
            at.path.append("{...}")
            raise
    # Set order depends on str hashing (randomized per process): always sort.
    items.sort(key=lambda e: _text(e, True))
    return {"$set" if type(v) is set else "$fset": items}


def _enc_tz(tz: tzinfo | None, owner: type) -> Any:
    if tz is None:
        return None
    if type(tz) is timezone:
        offset = tz.utcoffset(None)
        name = tz.tzname(None)
        return [
            "fixed",
            _enc_timedelta(offset, True),
            None if name == timezone(offset).tzname(None) else name,
        ]
    if type(tz).__module__ == "zoneinfo" and type(tz).__name__ == "ZoneInfo":
        key = getattr(tz, "key", None)
        if key:
            return ["zone", key]
    raise _At(owner, f"its tzinfo {type(tz).__qualname__} is not datetime.timezone or ZoneInfo")


def _enc_datetime(v: datetime, canon: bool) -> Any:
    return {
        "$dt": [v.replace(tzinfo=None, fold=0).isoformat(), v.fold, _enc_tz(v.tzinfo, datetime)]
    }


def _enc_time(v: time, canon: bool) -> Any:
    return {"$tm": [v.replace(tzinfo=None, fold=0).isoformat(), v.fold, _enc_tz(v.tzinfo, time)]}


def _enc_timedelta(v: timedelta, canon: bool) -> Any:
    return {"$td": [v.days, v.seconds, v.microseconds]}


def _enc_object(v: Any, canon: bool) -> Any:
    cls = type(v)
    reg = REGISTRY.by_cls(cls)
    if reg is not None and reg.encode is not None:
        try:
            inner = _enc(reg.encode(v), canon)
        except _At as at:
            at.path.append(f"<{reg.name}>")
            raise
        return {"$x": [reg.name, inner]}
    if isinstance(v, enum.Enum):
        try:
            return {"$enum": [_journal_name(cls), _enc(v.value, canon)]}
        except _At as at:
            at.path.append(".value")
            raise
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        name = _journal_name(cls)
        fields = {}
        for f in dataclasses.fields(v):
            try:
                fields[f.name] = _enc(getattr(v, f.name), canon)
            except _At as at:
                at.path.append(f".{f.name}")
                raise
        return {"$dc": [name, fields]}
    raise _At(cls)


_BUILTIN: dict[type, _Encoder] = {
    type(None): lambda v, c: v,
    bool: lambda v, c: v,
    int: _enc_int,
    str: lambda v, c: v,
    float: _enc_float,
    list: _enc_list,
    tuple: _enc_tuple,
    dict: _enc_dict,
    set: _enc_set,
    frozenset: _enc_set,
    bytes: lambda v, c: {"$b": base64.b64encode(v).decode("ascii")},
    datetime: _enc_datetime,
    date: lambda v, c: {"$date": v.isoformat()},
    time: _enc_time,
    timedelta: _enc_timedelta,
    Decimal: lambda v, c: {"$dec": str(v)},
    uuid.UUID: lambda v, c: {"$uuid": str(v)},
}


def _enc(v: Any, canon: bool) -> Any:
    handler = _BUILTIN.get(type(v))
    if handler is not None:
        return handler(v, canon)
    return _enc_object(v, canon)


def _json_writer(canon: bool) -> Callable[[Any], str]:
    """``JSONEncoder(...).encode`` for journal trees, built once.

    ``encode`` builds a C encoder per call, half the cost of encoding a small record;
    this one is built once, without the circular-reference check (``markers``), which
    only turns a cycle's RecursionError into a ValueError. Journal trees have no cycles:
    plain trees are checked to depth 64 and tagged trees are built fresh by ``_enc``.
    """
    encoder = json.JSONEncoder(
        sort_keys=canon, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )
    make = getattr(json.encoder, "c_make_encoder", None)
    quote = getattr(json.encoder, "c_encode_basestring", None)
    if make is None or quote is None:  # no C accelerator (another interpreter)
        return encoder.encode
    try:
        write = make(None, encoder.default, quote, None, ":", ",", canon, False, False)
    except TypeError:  # another signature than CPython 3.11-3.13's
        return encoder.encode
    join = "".join

    def text(tree: Any) -> str:
        return join(write(tree, 0))

    probe = {"b": [1, 2.5, None, True, "é\n"], "a": {}}
    return text if text(probe) == encoder.encode(probe) else encoder.encode


_WRITERS = {canon: _json_writer(canon) for canon in (False, True)}


def _text(tree: Any, canon: bool) -> str:
    return _WRITERS[canon](tree)


# Stored (non-canonical) bytes of a tree: orjson where it writes it exactly. Digests stay
# on the json writer above: their bytes must not change between releases.
_stored_text = plain_writer(_WRITERS[False])


def _encoded_tree(value: Any, canon: bool, where: str) -> Any:
    try:
        return _enc(value, canon)
    except _At as at:
        path = where + "".join(reversed(at.path))
        raise UnsupportedValueError(_refusal(at, path)) from None
    except RecursionError:
        raise UnsupportedValueError(f"cannot journal {where}: nested too deeply") from None


def _refusal(at: _At, path: str) -> str:
    name = f"{at.cls.__module__}.{at.cls.__qualname__}"
    why = f" ({at.detail})" if at.detail else ""
    return (
        f"cannot journal value of type {name} at {path}{why}: journaled values are JSON "
        "scalars, list, tuple, dict, set, bytes, datetime/date/time/timedelta, Decimal, "
        "UUID, dataclasses, Enums and types registered with agents_stream.register_codec(); "
        "convert it, register a codec, or pass non-journaled objects to the function via "
        "functools.partial or a closure (App(payload_codec=PickleCodec()) stores any "
        "result, for trusted topics only)"
    )


def _plain(v: Any, depth: int = 0) -> bool:
    """Whether ``v`` encodes as itself (JSON scalars, lists, dicts of ``str`` keys not
    starting with ``$``): then its encoding is plain ``json.dumps``, without building
    the tagged tree (outputs and results are mostly such trees; this is the hot path)."""
    t = type(v)
    if t is dict:
        for k in v:
            if type(k) is not str or k[:1] == "$":
                return False
        return depth <= 64 and _plain_all(v.values(), depth)
    if t is list:
        return depth <= 64 and _plain_all(v, depth)
    if t is str or t is bool or v is None:
        return True
    if t is int:
        return v.bit_length() <= _JSON_INT_BITS  # type: ignore[no-any-return]
    if t is float:
        return math.isfinite(v)
    return False


def _plain_all(items: Iterable[Any], depth: int) -> bool:
    # Leaves are tested inline: a call per leaf was most of the check's cost. Past
    # depth 64 the general path reports (or handles) the nesting.
    for item in items:
        ti = type(item)
        if ti is str or ti is bool or item is None:
            continue
        if ti is int:
            if item.bit_length() > _JSON_INT_BITS:
                return False
        elif ti is float:
            if not math.isfinite(item):
                return False
        elif not _plain(item, depth + 1):
            return False
    return True


def _tree(value: Any, canon: bool, where: str) -> Any:
    """The tagged tree of ``value``; plain trees (and a tuple of them, as call arguments
    are) are their own tree and skip the general walk."""
    if _plain(value):
        return value
    if type(value) is tuple and _plain_all(value, 0):  # call arguments, nearly always
        return {"$t": list(value)}
    return _encoded_tree(value, canon, where)


def encode_value(value: Any, *, where: str = "value") -> bytes:
    """Stored bytes of ``value``; raises UnsupportedValueError naming type and path."""
    return _HEADER + _stored_text(_tree(value, False, where))


def plain_bytes(value: Any) -> bytes | None:
    """Compact UTF-8 JSON of ``value`` as :func:`encode_value` writes it, when it is a
    plain tree that orjson writes (else None: the caller's json path decides): what a
    JSON output topic gets, whether its bytes come from the journal
    (:func:`plain_json`) or are encoded for it."""
    return dumps_plain(value) if _plain(value) else None


def plain_json(stored: bytes) -> bytes | None:
    """The compact UTF-8 JSON of the value ``stored`` (bytes of :func:`encode_value`),
    as :func:`plain_bytes` writes it, when it is a plain tree: then the stored text is that JSON
    already, and a JSON output topic can take it as is instead of encoding the value a
    second time. None when the value may not be plain or not strict UTF-8: a tag is an
    object key starting with ``$`` (so its text holds ``"$``; a plain string starting
    with ``$`` only costs the fallback), and a lone surrogate, which only the journal
    stores, is encoded from the byte 0xED."""
    if stored[:2] != _HEADER or b'"$' in stored or b"\xed" in stored:
        return None
    return stored[2:]


def canonical_bytes(value: Any, *, where: str = "value") -> bytes:
    """The digest encoding: equal values give equal bytes in every process."""
    return _text(_tree(value, True, where), True).encode("utf-8", "surrogatepass")


def value_digest(value: Any, *, where: str = "value") -> str:
    """SHA-256 (hex) of :func:`canonical_bytes`."""
    return hashlib.sha256(canonical_bytes(value, where=where)).hexdigest()


# -- decoding ---------------------------------------------------------------------------
def decode_value(data: bytes) -> Any:
    """The value of stored bytes: tagged (this module) or plain JSON (older journals).

    Raises:
        ValueError: malformed data, or a class it names is neither registered nor
            already imported (the caller names the journal slot).
    """
    raw = bytes(data)
    if raw[:1] != MAGIC:
        return json.loads(raw)
    if raw[1:2] != VERSION:
        raise ValueError(f"unknown journal value format version {raw[1:2]!r}")
    body = raw[2:]
    # No tag anywhere (none spelled with an escape either): the hook would return every
    # object as it is.
    if b'"$' not in body and b"\\u" not in body:
        return loads(body, "surrogatepass")
    return _decode_tagged(body)


def _decode_tagged(body: bytes) -> Any:
    """A tagged body, every object through the tag hook; malformed data raises
    ValueError (the caller names the journal slot), whatever a tag's payload holds."""
    try:
        return json.loads(body.decode("utf-8", "surrogatepass"), object_hook=_dec_object)
    except (ValueError, RecursionError):
        raise
    except Exception as exc:  # a tag's payload of the wrong shape, e.g. {"$enum": null}
        raise ValueError(f"malformed journal value: {type(exc).__name__}: {exc}") from exc


def _dec_class(name: str, want: type) -> Any:
    reg = REGISTRY.by_name(name)
    cls = reg.cls if reg is not None else _find_class(name)
    if cls is None:
        raise ValueError(
            f"journaled class {name} is not loaded: import its module before the action "
            "runs, or register it with agents_stream.register_type()"
        )
    structural = dataclasses.is_dataclass(cls) if want is object else issubclass(cls, want)
    if not structural:
        raise ValueError(f"journal names {name}, which is not a {want.__name__} here")
    return cls


def _dec_tz(spec: Any) -> tzinfo | None:
    if spec is None:
        return None
    if spec[0] == "fixed":
        offset = spec[1]
        return timezone(offset) if spec[2] is None else timezone(offset, spec[2])
    if spec[0] == "zone":
        import zoneinfo

        return zoneinfo.ZoneInfo(spec[1])
    raise ValueError(f"unknown time zone encoding {spec!r}")


def _dec_dataclass(payload: list[Any]) -> Any:
    cls = _dec_class(payload[0], object)
    values = payload[1]
    fields = dataclasses.fields(cls)
    obj = cls(**{f.name: values[f.name] for f in fields if f.init and f.name in values})
    for f in fields:
        if not f.init and f.name in values:
            object.__setattr__(obj, f.name, values[f.name])
    return obj


def _dec_registered(payload: list[Any]) -> Any:
    reg = REGISTRY.by_name(payload[0])
    if reg is None or reg.decode is None:
        raise ValueError(f"no codec registered for journal type {payload[0]!r}")
    return reg.decode(payload[1])


def _dec_float(text: str) -> float:
    return {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}[text]


def _dec_time(payload: list[Any]) -> time:
    return time.fromisoformat(payload[0]).replace(fold=payload[1], tzinfo=_dec_tz(payload[2]))


def _dec_datetime(payload: list[Any]) -> datetime:
    naive = datetime.fromisoformat(payload[0])
    return naive.replace(fold=payload[1], tzinfo=_dec_tz(payload[2]))


_TAGS: dict[str, Callable[[Any], Any]] = {
    "$f": _dec_float,
    "$int": lambda text: int(text, 16),
    "$t": tuple,
    "$d": lambda pairs: {k: v for k, v in pairs},
    "$set": set,
    "$fset": frozenset,
    "$b": lambda text: base64.b64decode(text, validate=True),
    "$dt": _dec_datetime,
    "$date": date.fromisoformat,
    "$tm": _dec_time,
    "$td": lambda p: timedelta(days=p[0], seconds=p[1], microseconds=p[2]),
    "$dec": Decimal,
    "$uuid": uuid.UUID,
    "$enum": lambda p: _dec_class(p[0], enum.Enum)(p[1]),
    "$dc": _dec_dataclass,
    "$x": _dec_registered,
}


def _dec_object(obj: dict[str, Any]) -> Any:
    if len(obj) == 1:
        (tag,) = obj
        if tag[:1] == "$":
            decode = _TAGS.get(tag)
            if decode is None:
                raise ValueError(f"unknown journal value tag {tag!r}")
            return decode(obj[tag])
    return obj
