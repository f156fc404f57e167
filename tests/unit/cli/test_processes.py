"""The ``worker --processes`` supervisor's policy, with stand-in children (tiny Python
scripts) instead of workers: fail fast during startup, restart with backoff later, stop
all on request."""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time
from pathlib import Path

import pytest

from agents_stream.cli.processes import Supervisor, child_args, failure_reason, parse_processes

CHILD = [sys.executable, "-c"]


def test_parse_processes() -> None:
    assert parse_processes("3") == 3
    assert parse_processes("auto") >= 1
    for bad in ("0", "-1", "x", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_processes(bad)


def test_child_args_differ_only_where_they_must(tmp_path: Path) -> None:
    base = ["-A", "m:app", "--processes", "1"]
    one = child_args(base, 1, data_dir=tmp_path, metrics_port=9100, worker_id="w")
    assert one == [
        *base,
        *("--data-dir", str(tmp_path / "process-1"), "--metrics-port", "9101"),
        *("--worker-id", "w-1"),
    ]
    assert child_args(base, 0, data_dir=tmp_path, metrics_port=None, worker_id=None) == [
        *base,
        "--data-dir",
        str(tmp_path / "process-0"),
    ]


def test_failure_reason_of_text_and_json_lines() -> None:
    text = "[2026-01-01 00:00:00,000] CRITICAL agents_stream.cli: worker stopped: fix it"
    assert failure_reason(text) == "fix it"
    assert failure_reason('{"level": "CRITICAL", "message": "worker stopped: x"}') == (
        "worker stopped: x"
    )
    assert failure_reason("other") == "other"


def test_a_child_failing_during_startup_stops_the_others(caplog) -> None:
    failing = "import sys; print('worker stopped: cannot reach the broker'); sys.exit(3)"
    sleeping = "import time; time.sleep(60)"
    supervisor = Supervisor([[sleeping], [failing]], startup_window=30, stop_timeout=1)
    supervisor._command = CHILD
    started = time.monotonic()
    with caplog.at_level(logging.INFO, "agents_stream.cli"):
        assert supervisor.run() == 3
    assert time.monotonic() - started < 10
    assert "process 1 failed during startup (exit code 3): cannot reach the broker" in (caplog.text)


def test_a_crash_after_startup_is_restarted_with_backoff(tmp_path: Path, caplog) -> None:
    starts = tmp_path / "starts"
    crashing = f"open({str(starts)!r}, 'a').write('x'); raise SystemExit(1)"
    supervisor = Supervisor([[crashing]], startup_window=0, stop_timeout=1)
    supervisor._command = CHILD
    timer = threading.Timer(5.5, supervisor.stop)
    timer.start()
    with caplog.at_level(logging.INFO, "agents_stream.cli"):
        supervisor.run()  # 0 or 1: whether the last start had crashed before the stop
    timer.cancel()
    # Started at 0, restarted after 1 s, again 2 s later; the next would be 4 s later.
    assert starts.read_text() == "xxx"
    assert "restarting in 1 s" in caplog.text and "restarting in 2 s" in caplog.text


def test_stop_sends_sigterm_and_returns_zero_on_clean_exits() -> None:
    graceful = (
        "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: sys.exit(0)); "
        "time.sleep(60)"
    )
    supervisor = Supervisor([[graceful], [graceful]], startup_window=30, stop_timeout=5)
    supervisor._command = CHILD
    threading.Timer(1.0, supervisor.stop).start()
    started = time.monotonic()
    assert supervisor.run() == 0
    assert time.monotonic() - started < 5


def test_a_child_ignoring_sigterm_is_killed(monkeypatch) -> None:
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    monkeypatch.setattr("agents_stream.cli.processes.STOP_GRACE", 0.5)
    supervisor = Supervisor([[stubborn]], startup_window=30, stop_timeout=0.5)
    supervisor._command = CHILD
    threading.Timer(1.0, supervisor.stop).start()
    assert supervisor.run() == 1
