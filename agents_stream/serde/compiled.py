"""Avro encoders and decoders specialised to one schema, generated once as Python code.

fastavro's schemaless writer and reader walk the parsed schema on every call and resolve
unions by trying branches; for the journal that dispatch costs more than the bytes. This
module turns a parsed schema into straight-line functions (one ``exec`` per schema), with
union branches chosen by record name or Python type and varints of small values looked up
in a table.

fastavro stays the reference. The compiled encoder only accepts data it can place without
guessing: anything else (a missing field that has a default, a value two union branches
could both take, a type fastavro might coerce, an integer out of range) raises
:class:`Misfit`, naming the field, and the caller re-encodes with fastavro, which either
writes it or names what is wrong. That is the one fallback: callers catch ``Misfit`` alone
(and count it); any other exception out of generated code is an error they raise with the
record named, never a reason to try fastavro instead. The compiled decoder handles only
writer == reader; any schema feature it does not know (logical types) makes
:func:`compile_schema` return ``None`` (logged, with the reason): the caller uses fastavro
for that schema. Any other failure to build the code raises :class:`~.errors.SchemaError`
naming the schema.

Generated source is registered in :mod:`linecache` under ``<avro NAME #N>``: tracebacks
through it show its lines, and ``linecache.getlines`` returns the whole module.

A reader that needs only a few fields of every record (the audit counts calls by
ActionState and status) takes a projection (:func:`compile_projection`): the object
decoder's walk and checks, building only those fields, about twice as fast.
"""

from __future__ import annotations

import itertools
import linecache
import logging
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import SchemaError

log = logging.getLogger("agents_stream.serde")

Encoder = Callable[[bytes, Any], bytes]
Decoder = Callable[[bytes, int], "tuple[Any, int]"]

_SMALL = 1 << 14
_PRIMITIVES = frozenset(("null", "boolean", "int", "long", "float", "double", "bytes", "string"))


_BUILDS = itertools.count(1)


class Misfit(Exception):
    """The compiled encoder will not place this datum; let fastavro decide.

    Its message names the field (``CallResult.index: not an int``). The only exception a
    caller may answer by encoding with fastavro instead.
    """


class Corrupt(Exception):
    """The body does not decode under the schema."""


class Unsupported(Exception):
    """The schema uses something the compiler does not handle (fastavro is used)."""


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


# Index = zigzag value: every length and most ints, union indexes and counts hit the table.
_V = tuple(_varint(z) for z in range(_SMALL))


# Two varint bytes (both with the continuation bit) per 14-bit chunk: timestamps and
# offsets take three lookups instead of a loop over seven bytes.
_C = tuple(bytes(((x & 0x7F) | 0x80, (x >> 7) | 0x80)) for x in range(_SMALL))


def _big(z: int, v: int, bits: int) -> bytes:
    if z < 0x10000000:  # < 28 bits: in range for int and long alike
        return _C[z & 0x3FFF] + _V[z >> 14]
    if z < 0x40000000000 and bits == 63:  # < 42 bits: epoch-millisecond timestamps
        return _C[z & 0x3FFF] + _C[z >> 14 & 0x3FFF] + _V[z >> 28]
    if not -(1 << bits) <= v < (1 << bits):
        raise Misfit(f"{v} is out of range for a {bits + 1}-bit Avro integer")
    out = b""
    while z >= _SMALL:
        out += _C[z & 0x3FFF]
        z >>= 14
    return out + _V[z]


def _long(n: int) -> bytes:
    z = (n << 1) ^ (n >> 63)
    return _V[z] if z < _SMALL else _big(z, n, 63)


# Strings of an ObjectBinding's ``recurring`` fields, encoded (length prefix and UTF-8)
# once per distinct value; at most this many values are kept per encoder.
RECURRING_LIMIT = 4096


def _recur(table: dict[str, bytes], v: str) -> bytes:
    """A recurring string's bytes, kept in ``table`` while it has room."""
    data = v.encode()
    n = len(data)
    out = (_V[n << 1] if n < _SMALL >> 1 else _long(n)) + data
    if len(table) < RECURRING_LIMIT:
        table[v] = out
    return out


def _more(b: Any, p: int, c: int) -> tuple[int, int]:
    # Unrolled, and the low 28 bits gathered in one-digit ints before a single wide
    # shift: timestamps and offsets are 5-7 bytes, and a loop costs twice as much.
    n = c & 0x7F
    c = b[p]
    if c < 0x80:
        return n | c << 7, p + 1
    n |= (c & 0x7F) << 7
    c = b[p + 1]
    if c < 0x80:
        return n | c << 14, p + 2
    n |= (c & 0x7F) << 14
    c = b[p + 2]
    if c < 0x80:
        return n | c << 21, p + 3
    n |= (c & 0x7F) << 21
    c = b[p + 3]
    if c < 0x80:
        return n | c << 28, p + 4
    h = c & 0x7F
    c = b[p + 4]
    if c < 0x80:
        return n | (h | c << 7) << 28, p + 5
    h |= (c & 0x7F) << 7
    c = b[p + 5]
    if c < 0x80:
        return n | (h | c << 14) << 28, p + 6
    h |= (c & 0x7F) << 14
    c = b[p + 6]
    if c < 0x80:
        return n | (h | c << 21) << 28, p + 7
    h |= (c & 0x7F) << 21
    c = b[p + 7]
    if c < 0x80:
        return n | (h | c << 28) << 28, p + 8
    h |= (c & 0x7F) << 28
    c = b[p + 8]
    if c < 0x80:
        return n | (h | c << 35) << 28, p + 9
    raise Corrupt("varint longer than 10 bytes")


# Length of a string or bytes from its first varint byte: -1 for anything but a one-byte
# non-negative length, which _length then decodes (or rejects).
_LEN = tuple(c >> 1 if c < 0x80 and not c & 1 else -1 for c in range(256))


def _length(b: Any, p: int) -> tuple[int, int]:
    c = b[p - 1]
    if c > 127:
        c, p = _more(b, p, c)
    n = (c >> 1) ^ -(c & 1)
    if n < 0:
        raise Corrupt("length past the end")
    return n, p


def _corrupt(what: str) -> Corrupt:
    return Corrupt(what)


_HELPERS: dict[str, Any] = {
    "_V": _V,
    "_big": _big,
    "_C": _C,
    "_new": object.__new__,
    "_setattr": object.__setattr__,
    "_long": _long,
    "_recur": _recur,
    "_more": _more,
    "_LEN": _LEN,
    "_length": _length,
    "_corrupt": _corrupt,
    "Misfit": Misfit,
    "_pf": struct.Struct("<f").pack,
    "_pd": struct.Struct("<d").pack,
    "_uf": struct.Struct("<f").unpack_from,
    "_ud": struct.Struct("<d").unpack_from,
}


class _Compiler:
    def __init__(self, schema: Any, record_names: bool) -> None:
        self.record_names = record_names
        self.named: dict[str, Any] = {}
        self.fn_of: dict[str, str] = {}
        self.ns: dict[str, Any] = dict(_HELPERS)
        self.lines: list[str] = []
        self.n = 0
        self.bindings: Mapping[str, ObjectBinding] = {}
        self.cls_of: dict[str, str] = {}
        # variable -> the field it holds ("CallResult.index"), for Misfit messages
        self.where: dict[str, str] = {}
        self._collect(schema)

    # -- schema walking ----------------------------------------------------------------
    def _collect(self, s: Any) -> None:
        if isinstance(s, list):
            for branch in s:
                self._collect(branch)
            return
        if isinstance(s, str):
            if s not in _PRIMITIVES and s not in self.named:
                raise Unsupported(f"unknown type {s!r}")
            return
        if not isinstance(s, dict) or "logicalType" in s:
            # Logical types change the Python values fastavro returns: leave them to it.
            raise Unsupported("logical types are decoded by fastavro")
        t = s.get("type")
        if t in ("record", "error", "enum", "fixed"):
            if s["name"] in self.named:
                return
            self.named[s["name"]] = s
            self.fn_of[s["name"]] = f"_r{len(self.fn_of)}"
            for f in s.get("fields", ()):
                self._collect(f["type"])
        elif t == "array":
            self._collect(s["items"])
        elif t == "map":
            self._collect(s["values"])
        elif t in _PRIMITIVES:
            return
        else:
            self._collect(t)

    def resolve(self, s: Any) -> Any:
        while True:
            if isinstance(s, str):
                if s in _PRIMITIVES:
                    return s
                s = self.named[s]
            elif isinstance(s, dict) and s.get("type") in _PRIMITIVES:
                return s["type"]
            elif isinstance(s, dict) and not isinstance(s.get("type"), str):
                s = s["type"]
            else:
                return s

    @staticmethod
    def kind(s: Any) -> str:
        return s if isinstance(s, str) else ("union" if isinstance(s, list) else s["type"])

    def var(self, stem: str = "v") -> str:
        self.n += 1
        return f"{stem}{self.n}"

    def const(self, value: Any) -> str:
        name = self.var("_k")
        self.ns[name] = value
        return name

    def emit(self, ind: int, line: str) -> None:
        self.lines.append("    " * ind + line)

    def misfit(self, v: str, why: str) -> str:
        """The statement raising :class:`Misfit` for ``v``, naming its field."""
        return f"raise Misfit({self.where.get(v, 'the datum') + ': ' + why!r})"

    def field_var(self, record: Any, name: str) -> str:
        v = self.var()
        self.where[v] = f"{record['name'].rsplit('.', 1)[-1]}.{name}"
        return v

    def item_var(self, stem: str, of: str, suffix: str) -> str:
        x = self.var(stem)
        self.where[x] = self.where.get(of, "the datum") + suffix
        return x

    def shift(self, z: str, v: str, bits: int, ind: int) -> None:
        """``z`` = zigzag of ``v``; a value ``<<`` rejects (a float, a string) is a
        Misfit: fastavro writes some of them (it truncates floats) and names the rest."""
        self.emit(ind, "try:")
        self.emit(ind + 1, f"{z} = ({v} << 1) ^ ({v} >> {bits})")
        self.emit(ind, "except TypeError:")
        self.emit(ind + 1, self.misfit(v, "not an int"))

    def build(self, name: str) -> Callable[..., Any]:
        source = "\n".join(self.lines) + "\n"
        # Registered with linecache under a name of its own: a traceback through generated
        # code shows its lines (and pdb can step through them), not a bare "<avro ...>".
        filename = f"<avro {name} #{next(_BUILDS)}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        exec(compile(source, filename, "exec"), self.ns)
        built: Callable[..., Any] = self.ns[name]
        return built


# -- encoder -------------------------------------------------------------------------------
class _EncoderCompiler(_Compiler):
    objects = False  # records are dicts (unions of records: (name, dict) tuples)

    def run(self, schema: Any) -> Encoder:
        self.late: list[tuple[str, list[str]]] = []
        for full, s in self.named.items():
            if s["type"] in ("record", "error"):
                self.emit(0, f"def {self.fn_of[full]}(d, ap):")
                for f in s["fields"]:
                    v = self.field_var(s, f["name"])
                    # fastavro writes a missing field's default (or null): its decision
                    self.emit(1, "try:")
                    self.emit(2, f"{v} = d[{f['name']!r}]")
                    self.emit(1, "except KeyError:")
                    self.emit(2, self.misfit(v, "missing"))
                    self.enc(self.resolve(f["type"]), v, 1)
                self.emit(1, "return")
        self.emit(0, "def encode(header, datum):")
        self.emit(1, "out = [header]")
        self.emit(1, "ap = out.append")
        self.enc(self.resolve(schema), "datum", 1)
        self.emit(1, 'return b"".join(out)')
        encode = self.build("encode")
        # Record functions exist only after the exec: fill the name -> function tables now.
        for table, names in self.late:
            self.ns[table].update({n: self.ns[self.fn_of[n]] for n in names})
        return encode

    def length(self, n: str, ind: int) -> None:
        self.emit(ind, f"ap(_V[{n} << 1] if {n} < {_SMALL >> 1} else _long({n}))")

    def enc(self, s: Any, v: str, ind: int, checked: bool = False) -> None:
        k = self.kind(s)
        e = self.emit
        if k == "null" and checked:  # the union's dispatch test already made the check
            return
        if k == "null":
            e(ind, f"if {v} is not None: {self.misfit(v, 'not None')}")
        elif k == "boolean":
            e(ind, f"if {v} is True: ap(b'\\x01')")
            e(ind, f"elif {v} is False: ap(b'\\x00')")
            e(ind, f"else: {self.misfit(v, 'not a bool')}")
        elif k in ("int", "long"):
            bits = 31 if k == "int" else 63
            z = self.var("z")
            # Floats and strings fail on the shift; bools encode as 0/1 like fastavro.
            self.shift(z, v, bits, ind)
            e(ind, f"ap(_V[{z}] if {z} < {_SMALL} else _big({z}, {v}, {bits}))")
        elif k in ("float", "double"):
            e(ind, f"if {v}.__class__ is not float and {v}.__class__ is not int:")
            e(ind + 1, self.misfit(v, "not a float"))
            e(ind, f"ap({'_pf' if k == 'float' else '_pd'}({v}))")
        elif k == "string":
            b, n = self.var("b"), self.var("n")
            e(ind, f"{b} = {v}.encode()")
            e(ind, f"{n} = len({b})")
            self.length(n, ind)
            e(ind, f"ap({b})")
        elif k == "bytes":
            n = self.var("n")
            if not checked:
                e(ind, f"if {v}.__class__ is not bytes: {self.misfit(v, 'not bytes')}")
            e(ind, f"{n} = len({v})")
            self.length(n, ind)
            e(ind, f"ap({v})")
        elif k == "fixed":
            e(ind, f"if {v}.__class__ is not bytes or len({v}) != {s['size']}:")
            e(ind + 1, self.misfit(v, f"not {s['size']} bytes"))
            e(ind, f"ap({v})")
        elif k == "enum":
            table = self.const({sym: _V[i << 1] for i, sym in enumerate(s["symbols"])})
            e(ind, f"ap({table}[{v}])")
        elif k in ("array", "map"):
            cls = "list" if k == "array" else "dict"
            e(ind, f"if {v}.__class__ is not {cls}: {self.misfit(v, f'not a {cls}')}")
            e(ind, f"if {v}:")
            n = self.var("n")
            e(ind + 1, f"{n} = len({v})")
            self.length(n, ind + 1)
            x = self.item_var("x", v, "[]")
            if k == "array":
                e(ind + 1, f"for {x} in {v}:")
                self.enc(self.resolve(s["items"]), x, ind + 2)
            else:
                key = self.item_var("k", v, " key")
                e(ind + 1, f"for {key}, {x} in {v}.items():")
                self.enc("string", key, ind + 2)
                self.enc(self.resolve(s["values"]), x, ind + 2)
            e(ind, "ap(b'\\x00')")
        elif k in ("record", "error"):
            e(ind, f"{self.fn_of[s['name']]}({v}, ap)")
        elif k == "union":
            self.enc_union(s, v, ind)
        else:
            raise Unsupported(f"type {k!r}")

    def enc_union(self, branches: list[Any], v: str, ind: int) -> None:
        resolved = [self.resolve(b) for b in branches]
        e = self.emit
        records = {
            b["name"]: i for i, b in enumerate(resolved) if self.kind(b) in ("record", "error")
        }
        first = self.enc_record_branches(records, v, ind) if records else "if"
        for test, i, branch in self.union_tests(resolved, v):
            e(ind, f"{first} {test}:")
            e(ind + 1, f"ap({_V[i << 1]!r})")
            self.enc(branch, v, ind + 1, checked=True)
            first = "elif"
        if first == "if":
            e(ind, self.misfit(v, "no union branch takes it without guessing"))
        else:
            e(ind, f"else: {self.misfit(v, 'no union branch takes it without guessing')}")

    def union_tests(self, resolved: list[Any], v: str) -> list[tuple[str, int, Any]]:
        """(test of ``v``, branch index, branch) of the branches a datum's type selects
        without guessing; record branches are left to the caller."""
        category = {
            "null": "null",
            "boolean": "bool",
            "int": "int",
            "long": "int",
            "float": "float",
            "double": "float",
            "string": "str",
            "enum": "str",
            "bytes": "bytes",
            "fixed": "bytes",
            "array": "list",
            "map": "dict",
            "record": "dict",
            "error": "dict",
        }
        cats = [category[self.kind(b)] for b in resolved]
        # fastavro takes the first branch that validates and its validators overlap
        # (an int is a valid double, a bool a valid long): such datums go to fastavro.
        ambiguous = {c for c in cats if cats.count(c) > 1}
        if "float" in cats:
            ambiguous.add("int")
        if "int" in cats or "float" in cats:
            ambiguous.add("bool")
        if "list" in cats:  # fastavro's array validator takes any sequence, bytes too
            ambiguous.update(("bytes", "str"))
        tests = {
            "null": "{v} is None",
            "bool": "{v} is True or {v} is False",
            "int": "{v}.__class__ is int",
            "float": "{v}.__class__ is float",
            "str": "{v}.__class__ is str",
            "bytes": "{v}.__class__ is bytes",
            "list": "{v}.__class__ is list",
            "dict": "{v}.__class__ is dict",
        }
        return [
            (tests[cat].format(v=v), i, branch)
            for i, (branch, cat) in enumerate(zip(resolved, cats, strict=True))
            if cat not in ambiguous
            and not (self.objects and self.kind(branch) in ("record", "error"))
        ]

    def enc_record_branches(self, records: dict[str, int], v: str, ind: int) -> str:
        # (full name, dict): the shape the journal writes and return_record_name reads.
        table = self.const({name: _V[i << 1] for name, i in records.items()})
        fns = self.const({})
        self.late.append((fns, list(records)))
        nm, x = self.var("nm"), self.var("x")
        self.emit(ind, f"if {v}.__class__ is tuple:")
        self.emit(ind + 1, f"{nm}, {x} = {v}")
        self.emit(ind + 1, f"ap({table}[{nm}])")
        self.emit(ind + 1, f"{fns}[{nm}]({x}, ap)")
        return "elif"


# -- decoder -------------------------------------------------------------------------------
class _DecoderCompiler(_Compiler):
    checked_lengths = True

    def run(self, schema: Any) -> Decoder:
        self.stack: list[str] = []
        for full, s in self.named.items():
            if s["type"] in ("record", "error"):
                self.emit(0, f"def {self.fn_of[full]}(b, p, L):")
                self.stack = [full]
                v = self.var()
                self.dec_record(s, v, 1)
                self.emit(1, f"return {v}, p")
        self.stack = []
        self.emit(0, "def decode(b, p):")
        self.emit(1, "L = len(b)")
        self.dec(self.resolve(schema), "value", 1)
        self.emit(1, "return value, p")
        return self.build("decode")

    def read_long(self, target: str, ind: int) -> None:
        c = self.var("c")
        self.emit(ind, f"{c} = b[p]")
        self.emit(ind, "p += 1")
        self.emit(ind, f"if {c} > 127: {c}, p = _more(b, p, {c})")
        self.emit(ind, f"{target} = ({c} >> 1) ^ -({c} & 1)")

    def take(self, n: str, target: str, ind: int, suffix: str = "") -> None:
        end = self.var("e")
        self.emit(ind, f"{end} = p + {n}")
        self.emit(ind, f"if {n} < 0 or {end} > L: raise _corrupt('length past the end')")
        self.emit(ind, f"{target} = b[p:{end}]{suffix}")
        self.emit(ind, f"p = {end}")

    def min_size(self, s: Any, seen: frozenset[str] = frozenset()) -> int:
        k = self.kind(s)
        if k == "null":
            return 0
        if k == "fixed":
            return min(int(s["size"]), 1)
        if k in ("record", "error"):
            if s["name"] in seen:
                return 1
            inner = seen | {s["name"]}
            return sum(min(self.min_size(self.resolve(f["type"]), inner), 1) for f in s["fields"])
        return 1

    def dec_record(self, s: Any, target: str, ind: int) -> None:
        names = []
        for f in s["fields"]:
            v = self.var()
            self.dec(self.resolve(f["type"]), v, ind)
            names.append(f"{f['name']!r}: {v}")
        self.emit(ind, f"{target} = {{{', '.join(names)}}}")

    def dec(self, s: Any, target: str, ind: int) -> None:
        k = self.kind(s)
        e = self.emit
        if k == "null":
            e(ind, f"{target} = None")
        elif k == "boolean":
            c = self.var("c")
            e(ind, f"{c} = b[p]")
            e(ind, "p += 1")
            e(ind, f"if {c} > 1: raise _corrupt('boolean byte is not 0 or 1')")
            e(ind, f"{target} = {c} == 1")
        elif k in ("int", "long"):
            self.read_long(target, ind)
        elif k in ("float", "double"):
            size, fn = (4, "_uf") if k == "float" else (8, "_ud")
            e(ind, f"{target}, = {fn}(b, p)")
            e(ind, f"p += {size}")
        elif k in ("string", "bytes"):
            n, end = self.var("n"), self.var("e")
            e(ind, f"{n} = _LEN[b[p]]")
            e(ind, "p += 1")
            e(ind, f"if {n} < 0: {n}, p = _length(b, p)")
            e(ind, f"{end} = p + {n}")
            if self.checked_lengths:
                e(ind, f"if {end} > L: raise _corrupt('length past the end')")
            e(ind, f"{target} = b[p:{end}]{'.decode()' if k == 'string' else ''}")
            e(ind, f"p = {end}")
        elif k == "fixed":
            self.take(str(s["size"]), target, ind)
        elif k == "enum":
            symbols = self.const(tuple(s["symbols"]))
            i = self.var("i")
            self.read_long(i, ind)
            e(ind, f"if not 0 <= {i} < {len(s['symbols'])}: raise _corrupt('enum index')")
            e(ind, f"{target} = {symbols}[{i}]")
        elif k in ("array", "map"):
            self.dec_block(s, k, target, ind)
        elif k in ("record", "error"):
            if s["name"] in self.stack:
                e(ind, f"{target}, p = {self.fn_of[s['name']]}(b, p, L)")
            else:
                self.stack.append(s["name"])
                self.dec_record(s, target, ind)
                self.stack.pop()
        elif k == "union":
            self.dec_union(s, target, ind)
        else:
            raise Unsupported(f"type {k!r}")

    def block_loop(self, s: Any, k: str, ind: int) -> Any:
        """Emits the loops over an array's or map's blocks and items, up to the item's
        body (at ``ind + 2``); returns the item schema."""
        e = self.emit
        item = self.resolve(s["items"] if k == "array" else s["values"])
        n = self.var("n")
        e(ind, "while True:")
        self.read_long(n, ind + 1)
        e(ind + 1, f"if {n} == 0: break")
        e(ind + 1, f"if {n} < 0:")
        e(ind + 2, f"{n} = -{n}")
        self.read_long(self.var("_"), ind + 2)
        # A corrupt count must fail before allocating or looping over it.
        limit = "L - p" if k == "map" or self.min_size(item) else str(1 << 20)
        e(ind + 1, f"if {n} > {limit}: raise _corrupt('block count past the end')")
        e(ind + 1, f"for _ in range({n}):")
        return item

    def dec_block(self, s: Any, k: str, target: str, ind: int) -> None:
        e = self.emit
        x = self.var("x")
        e(ind, f"{target} = {'[]' if k == 'array' else '{}'}")
        item = self.block_loop(s, k, ind)
        if k == "array":
            self.dec(item, x, ind + 2)
            e(ind + 2, f"{target}.append({x})")
        else:
            key = self.var("k")
            self.dec("string", key, ind + 2)
            self.dec(item, x, ind + 2)
            e(ind + 2, f"{target}[{key}] = {x}")

    def dec_union(self, branches: list[Any], target: str, ind: int) -> None:
        resolved = [self.resolve(b) for b in branches]
        n_records = sum(self.kind(b) in ("record", "error") for b in resolved)
        # fastavro's return_record_name_override: the name only where it disambiguates.
        named = self.record_names and n_records > 1
        # Compared still zigzag-encoded (branch i is 2 * i): no decoding on the hot path.
        i = self.var("i")
        self.emit(ind, f"{i} = b[p]")
        self.emit(ind, "p += 1")
        self.emit(ind, f"if {i} > 127: {i}, p = _more(b, p, {i})")
        for idx, branch in enumerate(resolved):
            self.emit(ind, f"{'if' if idx == 0 else 'elif'} {i} == {idx << 1}:")
            if named and self.kind(branch) in ("record", "error"):
                x = self.var("x")
                self.dec(branch, x, ind + 1)
                self.emit(ind + 1, f"{target} = ({branch['name']!r}, {x})")
            else:
                self.dec(branch, target, ind + 1)
        self.emit(ind, "else: raise _corrupt('union branch index out of range')")


# -- object codecs ---------------------------------------------------------------------------
@dataclass(frozen=True)
class ObjectBinding:
    """How one Avro record type maps onto a Python class, for :func:`compile_object_codec`.

    Args:
        cls: the class of the objects (union branches are told apart by exact class).
        get: field name -> expression reading that field from the object ``{o}``
            (default ``{o}.<field>``).
        build: given field name -> local variable holding its decoded value, the expression
            that builds the object (default: ``cls`` called with every field as keyword).
        env: names the expressions use.
        recurring: string fields with few distinct values (a topic, a worker id): their
            encoding is looked up by value instead of made each time.
    """

    cls: type
    get: Mapping[str, str] = field(default_factory=dict)
    build: Callable[[Mapping[str, str]], str] | None = None
    env: Mapping[str, Any] = field(default_factory=dict)
    recurring: frozenset[str] = frozenset()


ObjectEncoder = Callable[[bytes, Any], bytes]
ObjectDecoder = Callable[[bytes, int], "tuple[Any, int]"]


def _bind(compiler: _Compiler, bindings: Mapping[str, ObjectBinding]) -> None:
    missing = [
        n
        for n, s in compiler.named.items()
        if s["type"] in ("record", "error") and n not in bindings
    ]
    if missing:
        raise Unsupported(f"no object binding for {', '.join(missing)}")
    compiler.bindings = bindings
    compiler.cls_of = {}
    for name, b in bindings.items():
        compiler.ns.update(b.env)
        compiler.cls_of[name] = compiler.const(b.cls)


class _ObjectEncoderCompiler(_EncoderCompiler):
    """Objects to bytes, each record as one ``b"".join`` of its parts.

    A record's fields become expressions joined once (no ``list.append`` per part); only
    arrays and maps fall back to the appending code of the dict encoder.
    """

    objects = True
    _recurring: str | None = None  # the name of the recurring strings' table, once made

    def run(self, schema: Any) -> Encoder:
        self.late = []
        for full, s in self.named.items():
            if s["type"] in ("record", "error"):
                self.emit(0, f"def {self.fn_of[full]}(o):")
                parts = self.record_parts(s, "o", 1)
                self.emit(1, f"return b''.join(({', '.join(parts)},))")
        # The root record is inlined: one call per datum is all the framing costs.
        self.emit(0, "def encode(head, o):")
        parts = self.record_parts(schema, "o", 1)
        self.emit(1, f"return b''.join((head, {', '.join(parts)}))")
        return self.build("encode")

    def record_parts(self, s: Any, o: str, ind: int) -> list[str]:
        binding = self.bindings[s["name"]]
        get = binding.get
        parts: list[str] = []
        for f in s["fields"]:
            v = self.field_var(s, f["name"])
            self.emit(ind, f"{v} = {get.get(f['name'], '{o}.' + f['name']).format(o=o)}")
            kind = self.resolve(f["type"])
            if f["name"] in binding.recurring and self.kind(kind) == "string":
                parts.append(self.recurring(v, ind))
            else:
                parts += self.parts(kind, v, ind)
        return parts or ["b''"]

    def recurring(self, v: str, ind: int) -> str:
        """A string looked up by value (a dict subscript, no call) once encoded; a value
        that is not a string misses and fails in ``_recur`` as it would here."""
        table = self._recurring
        if table is None:
            table = self._recurring = self.const({})
        x = self.var("x")
        self.emit(ind, "try:")
        self.emit(ind + 1, f"{x} = {table}[{v}]")
        self.emit(ind, "except (KeyError, TypeError):")
        self.emit(ind + 1, f"{x} = _recur({table}, {v})")
        return x

    def parts(self, s: Any, v: str, ind: int, checked: bool = False) -> list[str]:
        """Emits the checks of ``v``; returns the expressions of its bytes, in order."""
        k = self.kind(s)
        e = self.emit
        if k == "null":
            if not checked:
                e(ind, f"if {v} is not None: {self.misfit(v, 'not None')}")
            return []
        if k == "boolean":
            x = self.var("x")
            e(ind, f"if {v} is True: {x} = b'\\x01'")
            e(ind, f"elif {v} is False: {x} = b'\\x00'")
            e(ind, f"else: {self.misfit(v, 'not a bool')}")
            return [x]
        if k in ("int", "long"):
            bits = 31 if k == "int" else 63
            z = self.var("z")
            self.shift(z, v, bits, ind)
            if k == "int":
                return [f"(_V[{z}] if {z} < {_SMALL} else _big({z}, {v}, {bits}))"]
            # _big's chunks inlined for longs: offsets and epoch-ms timestamps are 3-6 bytes.
            return [
                f"(_V[{z}] if {z} < {_SMALL} else "
                f"_C[{z} & 16383] + _V[{z} >> 14] if {z} < 268435456 else "
                f"_C[{z} & 16383] + _C[{z} >> 14 & 16383] + _V[{z} >> 28] "
                f"if {z} < 4398046511104 else _big({z}, {v}, 63))"
            ]
        if k in ("float", "double"):
            e(ind, f"if {v}.__class__ is not float and {v}.__class__ is not int:")
            e(ind + 1, self.misfit(v, "not a float"))
            return [f"{'_pf' if k == 'float' else '_pd'}({v})"]
        if k in ("string", "bytes"):
            n = self.var("n")
            if k == "string":
                data = self.var("b")
                e(ind, f"{data} = {v}.encode()")
            else:
                data = v
                if not checked:
                    e(ind, f"if {v}.__class__ is not bytes: {self.misfit(v, 'not bytes')}")
            e(ind, f"{n} = len({data})")
            return [f"(_V[{n} << 1] if {n} < {_SMALL >> 1} else _long({n}))", data]
        if k == "fixed":
            e(ind, f"if {v}.__class__ is not bytes or len({v}) != {s['size']}:")
            e(ind + 1, self.misfit(v, f"not {s['size']} bytes"))
            return [v]
        if k == "enum":
            table = self.const({sym: _V[i << 1] for i, sym in enumerate(s["symbols"])})
            return [f"{table}[{v}]"]
        if k in ("record", "error"):
            return [f"{self.fn_of[s['name']]}({v})"]
        if k == "union":
            return [self.union_parts(s, v, ind)]
        if k == "array":
            # Most of an entry's arrays are empty (an ActionDone's memory updates, events,
            # timers): their encoding is the end marker alone, no list and join.
            x, w = self.var("x"), self.var("w")
            e(ind, f"if {v}.__class__ is not tuple and {v}.__class__ is not list:")
            e(ind + 1, self.misfit(v, "not a tuple or list"))
            e(ind, f"if not {v}:")
            e(ind + 1, f"{x} = b'\\x00'")
            e(ind, "else:")
            e(ind + 1, f"{w} = []")
            e(ind + 1, f"ap = {w}.append")
            self.enc(s, v, ind + 1)
            e(ind + 1, f"{x} = b''.join({w})")
            return [x]
        if k == "map":
            x, w = self.var("x"), self.var("w")
            e(ind, f"{w} = []")
            e(ind, f"ap = {w}.append")
            self.enc(s, v, ind)
            e(ind, f"{x} = b''.join({w})")
            return [x]
        raise Unsupported(f"type {k!r}")

    def union_parts(self, branches: list[Any], v: str, ind: int) -> str:
        resolved = [self.resolve(b) for b in branches]
        x = self.var("x")
        first = "if"
        choices = [
            (f"{v}.__class__ is {self.cls_of[b['name']]}", i, b)
            for i, b in enumerate(resolved)
            if self.kind(b) in ("record", "error")
        ]
        for test, i, branch in choices + self.union_tests(resolved, v):
            self.emit(ind, f"{first} {test}:")
            parts = self.parts(branch, v, ind + 1, checked=True)
            self.emit(ind + 1, f"{x} = {' + '.join([repr(_V[i << 1]), *parts])}")
            first = "elif"
        self.emit(ind, f"else: {self.misfit(v, 'no union branch takes it without guessing')}")
        return x

    def enc(self, s: Any, v: str, ind: int, checked: bool = False) -> None:
        if self.kind(s) == "array":  # sequences of a dataclass are tuples
            self.emit(ind, f"if {v}.__class__ is not tuple and {v}.__class__ is not list:")
            self.emit(ind + 1, self.misfit(v, "not a tuple or list"))
            self.emit(ind, f"if {v}:")
            n, x = self.var("n"), self.item_var("x", v, "[]")
            self.emit(ind + 1, f"{n} = len({v})")
            self.length(n, ind + 1)
            self.emit(ind + 1, f"for {x} in {v}:")
            self.enc(self.resolve(s["items"]), x, ind + 2)
            self.emit(ind, "ap(b'\\x00')")
            return
        if self.kind(s) in ("record", "error"):
            self.emit(ind, f"ap({self.fn_of[s['name']]}({v}))")
            return
        super().enc(s, v, ind, checked)

    def enc_record_branches(self, records: dict[str, int], v: str, ind: int) -> str:
        first = "if"
        for name, i in records.items():
            self.emit(ind, f"{first} {v}.__class__ is {self.cls_of[name]}:")
            self.emit(ind + 1, f"ap({_V[i << 1]!r})")
            self.emit(ind + 1, f"ap({self.fn_of[name]}({v}))")
            first = "elif"
        return first


class _ObjectDecoderCompiler(_DecoderCompiler):
    # A string or bytes field running past the end leaves p past the end: the next read
    # raises IndexError, and after the last field the caller sees end > len(data).
    checked_lengths = False

    def record_functions(self) -> None:
        """One function per record type, for the records that recur."""
        for full, s in self.named.items():
            if s["type"] in ("record", "error"):
                self.emit(0, f"def {self.fn_of[full]}(b, p, L):")
                self.stack = [full]
                v = self.var()
                self.dec_record(s, v, 1)
                self.emit(1, f"return {v}, p")

    def run(self, schema: Any) -> Decoder:
        self.record_functions()
        self.stack = [schema["name"]]
        self.emit(0, "def decode(b, p):")
        self.emit(1, "L = len(b)")
        self.dec_record(schema, "value", 1)
        self.emit(1, "return value, p")
        return self.build("decode")

    def dec(self, s: Any, target: str, ind: int) -> None:
        if self.kind(s) == "long":
            self.read_wide(target, ind)
        else:
            super().dec(s, target, ind)

    def read_wide(self, target: str, ind: int) -> None:
        # _more inlined: longs (timestamps, offsets) are mostly 3-7 bytes, and the call
        # costs as much as the arithmetic. Bits 28+ gather in h so that n stays one digit.
        c, n, h = self.var("c"), self.var("n"), self.var("h")
        e = self.emit
        e(ind, f"{c} = b[p]")
        e(ind, "p += 1")
        e(ind, f"if {c} > 127:")
        d = ind + 1
        e(d, f"{n} = {c} & 127")
        for i in range(1, 9):
            shift = 7 * i
            e(d, f"{c} = b[p]")
            e(d, "p += 1")
            if shift < 28:
                e(d, f"if {c} < 128: {c} = {n} | {c} << {shift}")
                e(d, "else:")
                e(d + 1, f"{n} |= ({c} & 127) << {shift}")
            else:
                high = f"({h} | {c} << {shift - 28})" if shift > 28 else c
                e(d, f"if {c} < 128: {c} = {n} | {high} << 28")
                e(d, "else:")
                if shift == 28:
                    e(d + 1, f"{h} = {c} & 127")
                else:
                    e(d + 1, f"{h} |= ({c} & 127) << {shift - 28}")
            d += 1
        # Nine bytes with the continuation bit: _more reads them again and judges the tenth.
        e(d, f"{c}, p = _more(b, p - 8, b[p - 9])")
        e(ind, f"{target} = ({c} >> 1) ^ -({c} & 1)")

    def dec_record(self, s: Any, target: str, ind: int) -> None:
        binding = self.bindings[s["name"]]
        local = {}
        for f in s["fields"]:
            v = local[f["name"]] = self.var()
            self.dec(self.resolve(f["type"]), v, ind)
        if binding.build is not None:
            try:
                expr = binding.build(local)
            except KeyError as exc:  # a binding of another version's fields: declined
                raise Unsupported(f"the binding of {s['name']} needs field {exc}") from exc
        else:
            cls = self.cls_of[s["name"]]
            expr = f"{cls}({', '.join(f'{n}={v}' for n, v in local.items())})"
        self.emit(ind, f"{target} = {expr}")


class _ProjectionCompiler(_ObjectDecoderCompiler):
    """The object decoder's walk of a record that builds only some of its fields.

    Skipped fields are checked as the object decoder checks them (strings decoded as
    UTF-8, union, enum and boolean bytes, varint widths, block counts), without building
    anything: a body fails here exactly when it fails there. Only the top level is
    projected; a kept field is decoded whole.
    """

    def project(self, schema: Any, keep: tuple[str, ...]) -> Decoder:
        self.record_functions()  # kept fields may recur into them
        self.stack = [schema["name"]]
        self.emit(0, "def project(b, p):")
        self.emit(1, "L = len(b)")
        kept: dict[str, str] = {}
        for f in schema["fields"]:
            s = self.resolve(f["type"])
            if f["name"] in keep:
                kept[f["name"]] = v = self.var()
                self.dec(s, v, 1)
            else:
                self.skip(s, 1)
        if set(keep) - set(kept):
            raise Unsupported(f"no field {sorted(set(keep) - set(kept))} in {schema['name']}")
        self.emit(1, f"return ({''.join(kept[name] + ', ' for name in keep)}), p")
        return self.build("project")

    def skip(self, s: Any, ind: int) -> None:
        k = self.kind(s)
        e = self.emit
        if k == "null":
            return
        if k in ("int", "long"):
            # Continuation bits only: a varint fails past ten bytes, as _more does.
            c = self.var("c")
            e(ind, f"{c} = b[p]")
            e(ind, "p += 1")
            d = ind
            for _ in range(9):
                e(d, f"if {c} > 127:")
                e(d + 1, f"{c} = b[p]")
                e(d + 1, "p += 1")
                d += 1
            e(d, f"if {c} > 127: raise _corrupt('varint longer than 10 bytes')")
        elif k in ("boolean", "enum"):
            # The checks of dec() on a value nobody reads: cheap next to building it.
            self.dec(s, self.var("_"), ind)
        elif k in ("float", "double"):
            e(ind, f"p += {4 if k == 'float' else 8}")  # past the end: the end check fails
        elif k in ("string", "bytes"):
            n = self.var("n")
            e(ind, f"{n} = _LEN[b[p]]")
            e(ind, "p += 1")
            e(ind, f"if {n} < 0: {n}, p = _length(b, p)")
            if k == "string":  # invalid UTF-8 fails the full decode: here too
                end = self.var("e")
                e(ind, f"{end} = p + {n}")
                e(ind, f"b[p:{end}].decode()")
                e(ind, f"p = {end}")
            else:
                e(ind, f"p += {n}")
        elif k == "fixed":
            e(ind, f"p += {s['size']}")
            e(ind, "if p > L: raise _corrupt('length past the end')")
        elif k in ("array", "map"):
            item = self.block_loop(s, k, ind)
            e(ind + 2, "pass")
            if k == "map":
                self.skip("string", ind + 2)
            self.skip(item, ind + 2)
        elif k in ("record", "error"):
            if s["name"] in self.stack:
                raise Unsupported(f"recursive record {s['name']}")
            self.stack.append(s["name"])
            e(ind, "pass")
            for f in s["fields"]:
                self.skip(self.resolve(f["type"]), ind)
            self.stack.pop()
        elif k == "union":
            i = self.var("i")
            e(ind, f"{i} = b[p]")
            e(ind, "p += 1")
            e(ind, f"if {i} > 127: {i}, p = _more(b, p, {i})")
            for idx, branch in enumerate(self.resolve(b) for b in s):
                e(ind, f"{'if' if idx == 0 else 'elif'} {i} == {idx << 1}:")
                e(ind + 1, "pass")
                self.skip(branch, ind + 1)
            e(ind, "else: raise _corrupt('union branch index out of range')")
        else:
            raise Unsupported(f"type {k!r}")


def _declined(parsed: Any, what: str, exc: BaseException) -> None:
    """The compiler declined ``parsed`` (a feature it leaves to fastavro): said once, at
    construction, naming the schema; the caller then uses fastavro for it."""
    log.info(
        "no compiled %s for Avro schema %s (%s: %s); fastavro handles it",
        what, _schema_name(parsed), type(exc).__name__, exc,
    )  # fmt: skip


def _build_failed(parsed: Any, what: str, exc: Exception) -> SchemaError:
    """Building the code failed other than by declining: a bug of this module, or a
    parsed schema it misreads. Raised at codec construction, never answered with None."""
    return SchemaError(
        f"cannot generate the {what} of Avro schema {_schema_name(parsed)}: "
        f"{type(exc).__name__}: {exc} (a bug of agents_stream.serde.compiled)"
    )


def _schema_name(parsed: Any) -> str:
    name = parsed.get("name") if isinstance(parsed, dict) else None
    return repr(name) if name else f"of type {_Compiler.kind(parsed)!r}"


def compile_projection(
    record: Any, keep: tuple[str, ...], bindings: Mapping[str, ObjectBinding]
) -> ObjectDecoder | None:
    """A decoder of some top-level fields of one record type (as
    :func:`compile_object_codec` decodes them: nested records through ``bindings``).

    ``decoder(data, offset)`` returns ``(tuple of the kept fields in the order of keep,
    end offset)`` and raises, or returns an end past ``len(data)``, exactly where the
    object decoder would: the caller checks ``end == len(data)`` as there. ``None`` when
    the schema, the bindings or ``keep`` are not supported (logged).

    Raises:
        SchemaError: the code could not be built for another reason (named).
    """
    try:
        compiler = _ProjectionCompiler(record, record_names=False)
        _bind(compiler, bindings)
        return compiler.project(record, keep)
    except (Unsupported, RecursionError) as exc:
        _declined(record, f"projection {keep}", exc)
        return None
    except Exception as exc:
        raise _build_failed(record, f"projection {keep}", exc) from exc


def compile_object_codec(
    record: Any, bindings: Mapping[str, ObjectBinding]
) -> tuple[ObjectEncoder, ObjectDecoder] | None:
    """Encoder and decoder of one record type straight between objects and Avro bytes.

    ``record`` is a record schema as fastavro parsed it (e.g. one branch of a union) and
    must be self-contained; every record it reaches needs a binding. ``encoder(head, obj)``
    returns ``head`` + the record's body, or raises :class:`Misfit` when the object does
    not fit the fast shape (the caller may then take the general path) or another
    exception (a wrong value, or a bug: the caller raises it, naming the record);
    ``decoder(data, offset)`` returns ``(obj, end offset)`` and raises on a corrupt body,
    except that a body cut short inside its last string or bytes field returns an end
    offset past ``len(data)``: the caller must check ``end == len(data)``.
    ``None`` when the schema or the bindings are not supported (logged).

    Raises:
        SchemaError: the code could not be built for another reason (named).
    """
    try:
        enc = _ObjectEncoderCompiler(record, record_names=True)
        _bind(enc, bindings)
        dec = _ObjectDecoderCompiler(record, record_names=False)
        _bind(dec, bindings)
        return enc.run(record), dec.run(record)
    except (Unsupported, RecursionError) as exc:
        _declined(record, "object codec", exc)
        return None
    except Exception as exc:
        raise _build_failed(record, "object codec", exc) from exc


def compile_schema(parsed: Any, *, record_names: bool) -> tuple[Encoder, Decoder] | None:
    """Encoder and decoder of one parsed (fastavro) schema, or ``None`` if unsupported
    (logical types, a schema nested past the recursion limit: logged).

    ``encoder(header, datum)`` returns header + body, raises :class:`Misfit` when
    fastavro should decide, or another exception when the datum cannot be encoded (or
    the code is wrong): never a reason to use fastavro's bytes instead.
    ``decoder(data, offset)`` returns ``(value, end offset)`` shaped like fastavro's
    ``schemaless_reader`` with ``return_record_name`` and ``return_record_name_override``
    set to ``record_names``, and raises on a corrupt body.

    Raises:
        SchemaError: the code could not be built for another reason (named).
    """
    try:
        encoder = _EncoderCompiler(parsed, record_names).run(parsed)
        decoder = _DecoderCompiler(parsed, record_names).run(parsed)
    except (Unsupported, RecursionError) as exc:
        _declined(parsed, "codec", exc)
        return None
    except Exception as exc:
        raise _build_failed(parsed, "codec", exc) from exc
    return encoder, decoder
