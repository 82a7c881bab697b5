"""Local servers the tests start: a free port, waiting for one to answer, stopping its process group."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_up(
    proc: subprocess.Popen, answers: Callable[[], object], *, timeout: float, why_it_died: Callable[[], str]
) -> None:
    """Poll `answers` until it stops raising OSError; fail if `proc` exits or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, why_it_died()
        try:
            answers()
            return
        except OSError:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.5)


def stop_process_group(proc: subprocess.Popen) -> None:
    """SIGTERM the server's process group (it was started with start_new_session), SIGKILL after 30 s."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
