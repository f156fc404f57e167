"""The embedded broker's process handle, as benchmarks use it to account its CPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents_stream.testing import EmbeddedBroker

pytestmark = pytest.mark.broker


def test_pid_names_the_running_broker_process_only() -> None:
    broker = EmbeddedBroker()
    assert broker.pid is None  # not started
    with broker:
        pid = broker.pid
        assert pid is not None
        assert Path(f"/proc/{pid}").exists() or not Path("/proc").exists()
    assert broker.pid is None  # stopped
