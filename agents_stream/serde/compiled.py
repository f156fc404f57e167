"""Avro encoders and decoders specialised to one schema, generated once as Python code.

fastavro's schemaless writer and reader walk the parsed schema on every call and resolve
unions by trying branches; for the journal that dispatch costs more than the bytes. This
module turns a parsed schema into straight-line functions (one ``exec`` per schema), with
union branches chosen by record name or Python type and varints of small values looked up
in a table.

fastavro stays the reference. The compiled encoder only accepts data it can place without
guessing: anything else (a missing field that has a default, a value two union branches
could both take, a type fastavro might coerce) raises :class:`Misfit` and the caller
re-encodes with fastavro, which either writes it or names what is wrong. The compiled
decoder handles only writer == reader; any schema feature it does not know (logical types)
makes :func:`compile_schema` return ``None``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

Encoder = Callable[[bytes, Any], bytes]
Decoder = Callable[[bytes, int], "tuple[Any, int]"]

_SMALL = 1 << 14
_PRIMITIVES = frozenset(("null", "boolean", "int", "long", "float", "double", "bytes", "string"))


class Misfit(Exception):
    """The compiled encoder will not place this datum; let fastavro decide."""


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


def _big(z: int, v: int, bits: int) -> bytes:
    if not -(1 << bits) <= v < (1 << bits):
        raise Misfit(f"{v} is out of range for a {bits + 1}-bit Avro integer")
    return _varint(z)


def _long(n: int) -> bytes:
    z = (n << 1) ^ (n >> 63)
    return _V[z] if z < _SMALL else _big(z, n, 63)


def _more(b: Any, p: int, c: int) -> tuple[int, int]:
    n = c & 0x7F
    shift = 7
    while True:
        c = b[p]
        p += 1
        n |= (c & 0x7F) << shift
        if c < 0x80:
            return n, p
        shift += 7
        if shift > 63:
            raise Corrupt("varint longer than 10 bytes")


def _corrupt(what: str) -> Corrupt:
    return Corrupt(what)


_HELPERS: dict[str, Any] = {
    "_V": _V,
    "_big": _big,
    "_long": _long,
    "_more": _more,
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

    def build(self, name: str) -> Any:
        exec(compile("\n".join(self.lines), f"<avro {name}>", "exec"), self.ns)
        return self.ns[name]


# -- encoder -------------------------------------------------------------------------------
class _EncoderCompiler(_Compiler):
    def run(self, schema: Any) -> Encoder:
        self.late: list[tuple[str, list[str]]] = []
        for full, s in self.named.items():
            if s["type"] in ("record", "error"):
                self.emit(0, f"def {self.fn_of[full]}(d, ap):")
                for f in s["fields"]:
                    v = self.var()
                    self.emit(1, f"{v} = d[{f['name']!r}]")
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
            e(ind, f"if {v} is not None: raise Misfit")
        elif k == "boolean":
            e(ind, f"if {v} is True: ap(b'\\x01')")
            e(ind, f"elif {v} is False: ap(b'\\x00')")
            e(ind, "else: raise Misfit")
        elif k in ("int", "long"):
            bits = 31 if k == "int" else 63
            z = self.var("z")
            # Floats and strings fail on the shift; bools encode as 0/1 like fastavro.
            e(ind, f"{z} = ({v} << 1) ^ ({v} >> {bits})")
            e(ind, f"ap(_V[{z}] if {z} < {_SMALL} else _big({z}, {v}, {bits}))")
        elif k in ("float", "double"):
            e(ind, f"if {v}.__class__ is not float and {v}.__class__ is not int: raise Misfit")
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
                e(ind, f"if {v}.__class__ is not bytes: raise Misfit")
            e(ind, f"{n} = len({v})")
            self.length(n, ind)
            e(ind, f"ap({v})")
        elif k == "fixed":
            e(ind, f"if {v}.__class__ is not bytes or len({v}) != {s['size']}: raise Misfit")
            e(ind, f"ap({v})")
        elif k == "enum":
            table = self.const({sym: _V[i << 1] for i, sym in enumerate(s["symbols"])})
            e(ind, f"ap({table}[{v}])")
        elif k in ("array", "map"):
            cls = "list" if k == "array" else "dict"
            e(ind, f"if {v}.__class__ is not {cls}: raise Misfit")
            e(ind, f"if {v}:")
            n = self.var("n")
            e(ind + 1, f"{n} = len({v})")
            self.length(n, ind + 1)
            x = self.var("x")
            if k == "array":
                e(ind + 1, f"for {x} in {v}:")
                self.enc(self.resolve(s["items"]), x, ind + 2)
            else:
                key = self.var("k")
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
        kinds = [self.kind(b) for b in resolved]
        e = self.emit
        records = {
            b["name"]: i for i, b in enumerate(resolved) if self.kind(b) in ("record", "error")
        }
        if records:
            # (full name, dict): the shape the journal writes and return_record_name reads.
            table = self.const({name: _V[i << 1] for name, i in records.items()})
            fns = self.const({})
            self.late.append((fns, list(records)))
            nm, x = self.var("nm"), self.var("x")
            e(ind, f"if {v}.__class__ is tuple:")
            e(ind + 1, f"{nm}, {x} = {v}")
            e(ind + 1, f"ap({table}[{nm}])")
            e(ind + 1, f"{fns}[{nm}]({x}, ap)")
            first = "elif"
        else:
            first = "if"
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
        cats = [category[k] for k in kinds]
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
        for i, (branch, cat) in enumerate(zip(resolved, cats, strict=True)):
            if cat in ambiguous:
                continue
            e(ind, f"{first} {tests[cat].format(v=v)}:")
            e(ind + 1, f"ap({_V[i << 1]!r})")
            self.enc(branch, v, ind + 1, checked=True)
            first = "elif"
        if first == "if":
            e(ind, "raise Misfit")
        else:
            e(ind, "else: raise Misfit")


# -- decoder -------------------------------------------------------------------------------
class _DecoderCompiler(_Compiler):
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
            return min(s["size"], 1)
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
            n = self.var("n")
            self.read_long(n, ind)
            self.take(n, target, ind, ".decode()" if k == "string" else "")
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

    def dec_block(self, s: Any, k: str, target: str, ind: int) -> None:
        e = self.emit
        item = self.resolve(s["items"] if k == "array" else s["values"])
        n, x = self.var("n"), self.var("x")
        e(ind, f"{target} = {'[]' if k == 'array' else '{}'}")
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
        i = self.var("i")
        self.read_long(i, ind)
        for idx, branch in enumerate(resolved):
            self.emit(ind, f"{'if' if idx == 0 else 'elif'} {i} == {idx}:")
            if named and self.kind(branch) in ("record", "error"):
                x = self.var("x")
                self.dec(branch, x, ind + 1)
                self.emit(ind + 1, f"{target} = ({branch['name']!r}, {x})")
            else:
                self.dec(branch, target, ind + 1)
        self.emit(ind, "else: raise _corrupt('union branch index out of range')")


def compile_schema(parsed: Any, *, record_names: bool) -> tuple[Encoder, Decoder] | None:
    """Encoder and decoder of one parsed (fastavro) schema, or ``None`` if unsupported.

    ``encoder(header, datum)`` returns header + body, or raises (``Misfit`` or a Python
    error) when fastavro should decide; ``decoder(data, offset)`` returns
    ``(value, end offset)`` shaped like fastavro's ``schemaless_reader`` with
    ``return_record_name`` and ``return_record_name_override`` set to ``record_names``,
    and raises on a corrupt body.
    """
    try:
        encoder = _EncoderCompiler(parsed, record_names).run(parsed)
        decoder = _DecoderCompiler(parsed, record_names).run(parsed)
    except (Unsupported, KeyError, TypeError, RecursionError):
        return None
    return encoder, decoder
