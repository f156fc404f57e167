"""``agents-stream worker --processes N``: N worker processes of one App, one command.

Why: a worker is CPU-bound on one core (its event loop holds the GIL), so a machine
with more cores runs one worker per core. Started by hand, each needs its own data
directory (two running workers must never share RocksDB caches), metrics port and
worker id, and something has to restart a crashed one and stop them all on SIGTERM.
This supervisor does that and nothing else: every child is an ordinary
``agents-stream worker`` (same consumer group, so the partitions spread over them), and
the durable guarantees are the worker's own, whichever process runs a record.

Policy, the one an operator of gunicorn or a Kubernetes Deployment expects:

* child ``i`` gets ``<data dir>/process-<i>``, metrics port ``port + i`` and worker id
  ``<id>-<i>`` (default: host-pid, already distinct);
* a child that exits with an error within its startup window (startup timeout + 10 s:
  the app failed to import, the broker is unreachable, a topic is misconfigured) stops
  them all and the command exits with its code: every other child would fail the same
  way, and the last log line names the fix;
* a child that dies later (killed, out of memory, a bug) is restarted after a backoff
  (1 s, doubling to 30 s; back to 1 s once a child ran for a minute); its partitions
  move to the others meanwhile, as when any worker of a group dies;
* SIGTERM or SIGINT: every child gets SIGTERM (its own graceful stop: running records
  get ``--shutdown-timeout``), stragglers get SIGKILL once that and 20 s more are over.
  Children's log lines go through the supervisor's stderr, whole lines at a time.
  Children run in their own process group (a terminal's Ctrl-C reaches the supervisor
  only, which forwards one SIGTERM) and get SIGTERM if the supervisor itself dies.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

log = logging.getLogger("agents_stream.cli")

BACKOFF_FIRST = 1.0
BACKOFF_MAX = 30.0
HEALTHY_AFTER = 60.0  # a child that ran this long resets the backoff
STARTUP_GRACE = 10.0  # added to --startup-timeout: import, topics, first join
STOP_GRACE = 20.0  # added to --shutdown-timeout before stragglers are killed
PR_SET_PDEATHSIG = 1
PROCESS_ENV = "AGENTS_STREAM_PROCESS_INDEX"  # a child's index, shown in its text log lines


def parse_processes(text: str) -> int:
    """``--processes`` value: a positive count, or ``auto`` (one per CPU)."""
    if text.strip().lower() == "auto":
        return max(1, os.cpu_count() or 1)
    try:
        count = int(text)
    except ValueError:
        count = 0
    if count < 1:
        import argparse

        raise argparse.ArgumentTypeError(f"expected a positive number or 'auto', got {text!r}")
    return count


def child_args(
    base: Sequence[str],
    index: int,
    *,
    data_dir: Path,
    metrics_port: int | None,
    worker_id: str | None,
) -> list[str]:
    """``worker`` arguments of child ``index``: ``base`` (every option the supervisor
    was given that applies to each child as is) plus what must differ per child."""
    args = [*base, "--data-dir", str(data_dir / f"process-{index}")]
    if metrics_port is not None:
        args += ["--metrics-port", str(metrics_port + index)]
    if worker_id is not None:
        args += ["--worker-id", f"{worker_id}-{index}"]
    return args


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: SIGTERM this child when the supervisor dies, even by SIGKILL (no orphans
    left consuming in the group)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except Exception:
        pass


def _relay(child: _Child, stream: IO[bytes], out: IO[bytes]) -> None:
    """Copy a child's log lines to ours, whole lines at a time (so that processes'
    lines never interleave mid-line), remembering the last one."""
    for line in iter(stream.readline, b""):
        child.last_line = line.decode(errors="replace").strip() or child.last_line
        try:
            out.write(line)
            out.flush()
        except (OSError, ValueError):  # our own stderr went away: keep draining the pipe
            pass
    stream.close()


def failure_reason(line: str) -> str:
    """The message of a worker's last log line (text or JSON), without its prefix."""
    if line.startswith("{"):
        try:
            return str(json.loads(line).get("message", line))
        except ValueError:
            return line
    _, sep, rest = line.partition("worker stopped: ")
    return rest if sep else line


@dataclass
class _Child:
    index: int
    args: list[str]
    last_line: str = ""
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    backoff: float = BACKOFF_FIRST
    restart_at: float | None = None
    relay: threading.Thread | None = None
    exits: list[int] = field(default_factory=list)


class Supervisor:
    """Runs ``len(children)`` worker processes until SIGTERM/SIGINT (see the module doc).

    ``run`` returns the command's exit code: 0 after a requested stop in which every
    child stopped cleanly, the failing child's code after a startup failure, 1 if a
    child had to be killed or failed to stop."""

    def __init__(
        self,
        children: Sequence[list[str]],
        *,
        startup_window: float,
        stop_timeout: float,
        command: Sequence[str] = (sys.executable, "-m", "agents_stream", "worker"),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._children = [_Child(i, list(a)) for i, a in enumerate(children)]
        self._startup_window = startup_window
        self._stop_timeout = stop_timeout
        self._command = list(command)
        self._clock = clock
        self._stopping = False
        self._failure = ""  # the startup failure that ended the run, logged last

    def stop(self, *_: object) -> None:
        """Request the stop; safe from a signal handler."""
        self._stopping = True

    @property
    def pids(self) -> list[int]:
        return [c.proc.pid for c in self._children if c.proc is not None]

    def run(self) -> int:
        previous = {s: signal.signal(s, self.stop) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            for child in self._children:
                self._start(child)
            log.info(
                "supervising %d worker processes: pids %s",
                len(self._children),
                ", ".join(map(str, self.pids)),
            )
            code = self._watch()
            stopped = self._stop_all()
            if self._failure:
                # Last, after the other children's lines: the command's last line names
                # the fix (the relays of the stopped children are done by now).
                for child in self._children:
                    if child.relay is not None:
                        child.relay.join(5)
                log.critical(self._failure)
            return code if code else stopped
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _start(self, child: _Child) -> None:
        cmd = [*self._command, *child.args]
        child.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**os.environ, PROCESS_ENV: str(child.index)},
            process_group=0,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
        assert child.proc.stdout is not None
        relay = threading.Thread(
            target=_relay,
            args=(child, child.proc.stdout, sys.stderr.buffer),
            name=f"agents-stream-relay-{child.index}",
            daemon=True,
        )
        relay.start()
        child.relay = relay
        child.started = self._clock()
        child.restart_at = None

    def _watch(self) -> int:
        """Until a stop is requested (0) or a child fails during startup (its code)."""
        while not self._stopping:
            now = self._clock()
            for child in self._children:
                if child.restart_at is not None:
                    if now >= child.restart_at:
                        self._start(child)
                        log.info("worker process %d restarted: pid %d", child.index, child.proc.pid)  # type: ignore[union-attr]
                    continue
                assert child.proc is not None
                code = child.proc.poll()
                if code is None:
                    continue
                child.exits.append(code)
                ran = now - child.started
                if code > 0 and ran < self._startup_window:
                    if child.relay is not None:
                        child.relay.join(5)  # its last line, to name the fix in ours
                    self._failure = (
                        f"worker stopped: process {child.index} failed during startup "
                        f"(exit code {code}): {failure_reason(child.last_line)}"
                    )
                    return code
                if ran >= HEALTHY_AFTER:
                    child.backoff = BACKOFF_FIRST
                log.warning(
                    "worker process %d (pid %d) exited with %s after %.0f s; restarting in "
                    "%.0f s (its partitions move to the other workers meanwhile)",
                    child.index,
                    child.proc.pid,
                    f"code {code}" if code >= 0 else f"signal {-code}",
                    ran,
                    child.backoff,
                )
                child.restart_at = now + child.backoff
                child.backoff = min(child.backoff * 2, BACKOFF_MAX)
            time.sleep(0.2)
        return 0

    def _stop_all(self) -> int:
        running = [c.proc for c in self._children if c.proc is not None and c.restart_at is None]
        for proc in running:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = self._clock() + self._stop_timeout + STOP_GRACE
        code = 0
        for proc in running:
            try:
                exit_code = proc.wait(max(0.0, deadline - self._clock()))
            except subprocess.TimeoutExpired:
                log.error("worker pid %d did not stop in time: killed", proc.pid)
                proc.kill()
                proc.wait()
                code = 1
                continue
            if exit_code != 0 and not self._stopping:
                continue  # the child whose failure ended the run: its code is returned
            if exit_code != 0:
                log.error("worker pid %d stopped with code %d", proc.pid, exit_code)
                code = 1
        return code
