"""ActionState keys are built by hand-written formatting on the hot path: they must stay
byte-identical to the generic encoding of each entry's compaction identity (the layout
every cache and every other worker version reads)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from agents_stream.durable import keys
from agents_stream.durable.journal import (
    ActionDone,
    ActionRef,
    CallEntry,
    CallStatus,
    entry_key,
    ref_identity,
)

SEP = "\x1f"
_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
_refs = st.builds(
    ActionRef,
    key=_text,
    seq=st.integers(-(2**63), 2**63),
    action=_text.map(lambda a: f"agent#{a}"),
    partition=st.integers(0, 1000),
    topic=st.one_of(st.just(""), _text),  # "": a legacy (pre-v5) ref
)


def _old_tail(ref: ActionRef) -> str:
    return SEP.join(str(part) for part in ref_identity("", ref)[1:])


@given(ref=_refs, index=st.integers(0, 10**9))
def test_key_functions_equal_the_generic_identity_encoding(ref, index):
    tail = _old_tail(ref)
    call = CallEntry(ref, index, "fn", "digest", CallStatus.SUCCEEDED)
    done = ActionDone(ref)
    for _ in range(2):  # the first call fills the per-ref cache, the second reads it
        assert keys.done_key(ref) == f"a{SEP}{tail}".encode()
        assert keys.call_key(ref, index) == f"c{SEP}{tail}{SEP}{index}".encode()
        assert keys.calls_prefix(ref) == f"c{SEP}{tail}{SEP}".encode()
        assert keys.entry_key_bytes(done) == keys.encode_identity(entry_key(done))
        assert keys.entry_key_bytes(call) == keys.encode_identity(entry_key(call))
        assert keys.done_key(ref) == keys.encode_identity(entry_key(done))
        assert keys.call_key(ref, index) == keys.encode_identity(entry_key(call))
