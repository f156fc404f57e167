"""Progress: formatting, terminal vs log mode, rate and ETA on an injected clock."""

from __future__ import annotations

import io
import logging

from agents_stream.progress import Progress


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_line_has_done_total_percent_rate_and_eta():
    clock = Clock()
    p = Progress("rebuild of t[0,1]", total=300_000, clock=clock, tty=False)
    p.done = 120_000
    clock.now += 2.0
    assert p.line() == "rebuild of t[0,1]: 120,000/300,000 records (40%), 60,000/s, ETA 3 s"


def test_line_without_total_or_rate():
    p = Progress("scan", clock=Clock(), tty=False)
    assert p.line() == "scan: 0 records, 0/s"
    empty = Progress("scan", total=0, clock=Clock(), tty=False)
    assert empty.line() == "scan: 0/0 records (100%), 0/s"


def test_long_eta_is_minutes_and_hours():
    clock = Clock()
    p = Progress("x", total=10_000, clock=clock, tty=False)
    p.done = 1
    clock.now += 1.0
    assert p.line().endswith("ETA 2 h 46 min")
    p.total = 100
    assert p.line().endswith("ETA 1 min 39 s")


def test_log_mode_reports_once_per_interval(caplog):
    clock = Clock()
    log = logging.getLogger("test.progress")
    p = Progress("job", total=100, interval=5.0, clock=clock, tty=False, logger=log)
    with caplog.at_level(logging.INFO, logger="test.progress"):
        p.advance(10)  # before the interval: silent
        clock.now += 5.0
        p.advance(40)
        clock.now += 1.0
        p.advance(10)  # within the next interval: silent
        clock.now += 4.0
        p.advance(40)
        p.close()
    assert [r.getMessage() for r in caplog.records] == [
        "job: 50/100 records (50%), 10/s, ETA 5 s",
        "job: 100/100 records (100%), 10/s, ETA 0 s",
        "job: 100/100 records (100%), 10/s, ETA 0 s",
    ]


def test_quick_scan_stays_quiet(caplog):
    stream = io.StringIO()
    with caplog.at_level(logging.INFO), Progress("q", total=5, stream=stream, clock=Clock()) as p:
        p.advance(5)
    assert caplog.records == [] and stream.getvalue() == ""


def test_terminal_mode_rewrites_one_line_on_the_stream(caplog):
    clock = Clock()
    stream = io.StringIO()
    p = Progress("job", total=4, interval=5.0, stream=stream, tty=True, clock=clock)
    with caplog.at_level(logging.INFO):
        for _ in range(4):
            clock.now += 0.5  # terminal updates are faster than the log interval
            p.advance(1)
        p.close()
    out = stream.getvalue()
    assert out.count("\r\x1b[K") == 5 and out.endswith("job: 4/4 records (100%), 2/s, ETA 0 s\n")
    assert "\n" not in out[:-1]
    assert caplog.records == []


def test_tty_mode_follows_the_stream():
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert Progress("a", stream=Tty()).tty is True
    assert Progress("a", stream=io.StringIO()).tty is False
