"""The CLI at its edges (issue 67): ``agents-stream broker`` refuses a taken port or an
impossible one in one line and a non-zero exit at once, never "broker ready" for a broker
that died (the user would work against whatever else holds the port); ``--version``; every
command has a description in ``--help``."""

from __future__ import annotations

import argparse
import signal
import socket
import subprocess
import sys
import time

CLI = [sys.executable, "-m", "agents_stream", "broker"]


def test_a_port_another_process_listens_on_is_refused_in_one_line():
    holder = socket.socket()  # not a Kafka broker: nothing would answer the probe
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        started = time.monotonic()
        done = subprocess.run(
            [*CLI, "--port", str(port)], capture_output=True, text=True, timeout=30
        )
    finally:
        holder.close()
    assert done.returncode == 1 and "broker ready" not in done.stdout
    assert done.stderr.splitlines() == [
        f"error: port {port} on 127.0.0.1 is in use (Address already in use): another broker "
        "or process listens there; stop it or pass another --port"
    ]
    assert time.monotonic() - started < 10


def test_a_port_outside_tcp_is_refused_by_the_parser():
    done = subprocess.run([*CLI, "--port", "99999"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "argument --port: '99999' is not a TCP port (1-65535)" in done.stderr


def test_a_second_broker_on_the_first_ones_port_is_refused_and_the_first_serves_on():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    first = subprocess.Popen([*CLI, "--port", str(port)], stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout is not None
        assert first.stdout.readline().startswith(f"broker ready on kafka://127.0.0.1:{port}")
        second = subprocess.run(
            [*CLI, "--port", str(port)], capture_output=True, text=True, timeout=30
        )
        assert second.returncode == 1 and "is in use" in second.stderr
        assert first.poll() is None
    finally:
        first.send_signal(signal.SIGTERM)
        assert first.wait(20) == 0


def test_version_and_every_command_described():
    from agents_stream import __version__
    from agents_stream.cli.main import build_parser

    done = subprocess.run(
        [sys.executable, "-m", "agents_stream", "--version"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == f"agents-stream {__version__}"
    parser = build_parser()
    for argv in (["state", "tombstone"], ["spark", "audit"], ["spark", "backfill"]):
        action = parser
        for word in argv:
            sub = next(a for a in action._actions if isinstance(a, argparse._SubParsersAction))
            action = sub.choices[word]
        assert action.description, argv


def test_state_and_dlq_say_an_unreachable_cluster_in_one_line_within_the_budget(tmp_path):
    """Issue 67, item 3: they took 30 s, and librdkafka's FAIL line came first."""
    (tmp_path / "edge_app.py").write_text(
        "from agents_stream import Agent, App, InputEvent, action\n"
        "class Edge(Agent):\n"
        "    @action(InputEvent)\n"
        "    @staticmethod\n"
        "    def handle(event, ctx):\n"
        "        pass\n"
        "app = App('edge')\n"
        "app.agent(Edge, input='edge-in', output='edge-out')\n"
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    for command in (["state", "show", "--key", "x"], ["state", "stats"], ["dlq", "show"]):
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "agents_stream", *command[:2], "-A", "edge_app:app",
             *command[2:], "--broker", f"kafka://127.0.0.1:{port}"],
            cwd=tmp_path, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 1, done.stderr
        assert done.stderr.splitlines() == [done.stderr.strip()], done.stderr
        assert done.stderr.startswith(f"error: cannot reach the Kafka cluster at 127.0.0.1:{port}")
        assert time.monotonic() - started < 20
