"""Element queues: first completion wins; ordered and segmented unordered emission."""

from __future__ import annotations

from agents_stream.aio import Element
from agents_stream.aio._queue import OrderedQueue, RecordEntry, UnorderedQueue, WatermarkEntry


def drain_ready(queue) -> list:
    out = []
    while (entry := queue.pop_completed()) is not None:
        out.append(entry.timestamp if isinstance(entry, WatermarkEntry) else entry.element.value)
    return out


def complete(queue, entry, value=None) -> None:
    assert entry.complete([value], None)
    queue.on_completed(entry)


def test_repeated_complete_is_ignored():
    entry = RecordEntry(Element(1))
    assert entry.complete(["first"], None)
    assert not entry.complete(None, TimeoutError())
    assert not entry.complete(["second"], None)
    assert entry.results == ["first"] and entry.error is None


def test_ordered_queue_waits_for_the_head():
    queue = OrderedQueue()
    a, b = RecordEntry(Element("a")), RecordEntry(Element("b"))
    queue.put(a)
    queue.put(b)
    queue.put(WatermarkEntry(5))
    complete(queue, b)
    assert drain_ready(queue) == []
    complete(queue, a)
    assert drain_ready(queue) == ["a", "b", 5]


def test_unordered_queue_with_barriers_holds_later_segments():
    queue = UnorderedQueue(watermark_barriers=True)
    a, b, c = (RecordEntry(Element(v)) for v in "abc")
    queue.put(a)
    queue.put(b)
    queue.put(WatermarkEntry(1))
    queue.put(c)
    complete(queue, c)
    complete(queue, b)
    assert drain_ready(queue) == ["b"]
    complete(queue, a)
    assert drain_ready(queue) == ["a", 1, "c"]


def test_unordered_queue_without_barriers_lets_watermarks_pass():
    queue = UnorderedQueue(watermark_barriers=False)
    a = RecordEntry(Element("a"))
    queue.put(a)
    queue.put(WatermarkEntry(1))
    assert drain_ready(queue) == [1]
    complete(queue, a)
    assert drain_ready(queue) == ["a"]
