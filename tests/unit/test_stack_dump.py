"""SIGUSR1 makes a service write every thread's stack to stderr and go on (what a process
that does not stop is doing, without a debugger)."""

from __future__ import annotations

import subprocess
import sys

_SERVICE = """
import os, signal, threading, time
from processor.cli.common import stop_on_signals

stopped = threading.Event()
stop_on_signals(stopped.set)

def stuck_here() -> None:
    threading.Event().wait(30)

threading.Thread(target=stuck_here, name="stuck", daemon=True).start()
time.sleep(0.2)
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
    assert 'File "<string>", line 9 in stuck_here' in done.stderr
    assert "Current thread" in done.stderr  # the main thread's stack too
