"""SIGUSR1 makes a service write every thread's stack to stderr and go on (what a process
that does not stop is doing, without a debugger)."""

from __future__ import annotations

import subprocess
import sys

_SERVICE = """
import os, signal, threading
from processor.cli.common import stop_on_signals

stopped = threading.Event()
stop_on_signals(stopped.set)

waiting = threading.Event()

def stuck_here() -> None:
    waiting.set()
    threading.Event().wait(30)

threading.Thread(target=stuck_here, name="stuck", daemon=True).start()
assert waiting.wait(10)  # the thread is in stuck_here when its stack is written
os.kill(os.getpid(), signal.SIGUSR1)
print("still running", flush=True)
os.kill(os.getpid(), signal.SIGTERM)
assert stopped.wait(5)
print("stopped cleanly", flush=True)
"""


def test_sigusr1_writes_every_threads_stack_and_the_service_goes_on() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _SERVICE], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["still", "running", "stopped", "cleanly"]
    assert 'File "<string>", line 12 in stuck_here' in done.stderr
    assert "Current thread" in done.stderr  # the main thread's stack too
