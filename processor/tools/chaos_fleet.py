"""The chaos run's child processes: `ductor process` and `ductor worker` instances that are
killed with SIGKILL and started again, some processors armed to kill themselves right after a
commit (``DUCTOR_TEST_FAULTS=after_commit=kill@N``), and a watch for any that exits on its own.

Each start of a member is an incarnation with its own log file (JSON lines), so the stats of
every incarnation can be read back afterwards, killed ones included (from their last periodic
``processor stats`` line).
"""

from __future__ import annotations

import contextlib
import random
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from processor.io.config.settings import Settings, child_env
from processor.io.telemetry.logs import read_stats
from processor.tools.chaos_steps import execution_log_env
from processor.tools.child import popen_ductor
from processor.tools.waiting import eventually

PROCESSOR, WORKER = "process", "worker"
# The workers run the sample steps, counting their executions (chaos_steps.py).
_WORKER_ARGS = ("--concurrency", "4", "--app", "processor.tools.chaos_steps:registry")
# Kinds of kill, as the report names them.
KILL_PROCESSOR, KILL_WORKER, KILL_AFTER_COMMIT = (
    "processor SIGKILL",
    "worker SIGKILL",
    "processor after_commit",
)
_WATCH_S = 0.2
# The line each kind logs once it is connected and subscribed.
_STARTED = {PROCESSOR: b'"msg":"processor started"', WORKER: b'"msg":"worker started"'}


@dataclass
class Incarnation:
    proc: subprocess.Popen[bytes]
    log_path: Path
    armed: str  # DUCTOR_TEST_FAULTS of this start ("" when none)
    handled: bool = False  # its end was counted (and the member started again)
    started: bool = False  # it logged that it runs (connected, subscribed)


@dataclass
class Member:
    name: str
    kind: str  # PROCESSOR or WORKER
    incarnations: list[Incarnation] = field(default_factory=list)

    @property
    def current(self) -> Incarnation:
        return self.incarnations[-1]


@dataclass(frozen=True)
class Exit:
    """A member that ended on its own (not by our SIGKILL nor by its armed fault)."""

    name: str
    code: int | None
    log_tail: str


@dataclass(frozen=True)
class Arming:
    """How processors are armed: the first processor's first start, then each start with
    ``probability``, while ``budget`` lasts, to kill itself at a commit drawn from
    ``commits``."""

    probability: float = 0.3
    budget: int = 15
    commits: tuple[int, int] = (3, 40)


class ChaosFleet:
    """Processors and workers started from ``settings``; thread-safe (the fault schedule and
    the watch thread both act on it)."""

    def __init__(
        self,
        settings: Settings,
        log_dir: Path,
        processors: int,
        workers: int,
        rng: random.Random,
        arming: Arming,
        on_fault: Callable[[str, str], None],
    ) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        self._env = child_env(replace(settings, log_format="json")) | execution_log_env(settings)
        self._log_dir = log_dir
        self._rng = rng
        self._arming = arming
        self._armed_left = arming.budget
        self._on_fault = on_fault  # (kind, member name): a kill happened
        self._lock = threading.RLock()
        self._held = 0  # while > 0 (an outage), members that end are not started again
        self._stopping = threading.Event()
        self.members = [Member(f"process-{i}", PROCESSOR) for i in range(1, processors + 1)]
        self.members += [Member(f"worker-{i}", WORKER) for i in range(1, workers + 1)]
        self.kills: Counter[str] = Counter()
        self.restarts = 0
        self.exits: list[Exit] = []
        self._watch = threading.Thread(target=self._watch_loop, name="chaos-watch", daemon=True)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        with self._lock:
            for member in self.members:
                self._launch(member)
        self._watch.start()

    def stop_arming(self) -> None:
        """No further start is armed (those already armed stay so)."""
        with self._lock:
            self._armed_left = 0

    def stop(self, timeout_s: float = 30.0) -> dict[str, int | None]:
        """SIGTERM every running member and wait; returns each one's exit code (None: had to
        be killed). Members already down are counted as the watch would have."""
        self._stopping.set()
        self._watch.join(5)
        self._wait_started(timeout_s)
        with self._lock:
            running = []
            for member in self.members:
                if member.current.proc.poll() is None:
                    member.current.proc.send_signal(signal.SIGTERM)
                    running.append(member)
                else:
                    self._count_end(member)
            codes: dict[str, int | None] = {}
            deadline = time.monotonic() + timeout_s
            for member in running:
                proc = member.current.proc
                try:
                    codes[member.name] = proc.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
                    codes[member.name] = None
            return codes

    @contextlib.contextmanager
    def outage(self, start_timeout_s: float = 60.0) -> Iterator[list[str]]:
        """For the time of an outage: first wait until every member runs (it logged its
        start), then hold restarts: a member that ends waits to be started again until the
        outage is over. A process still connecting when a service goes down fails its start
        by design (a first connection is not retried), which says nothing about riding
        through an outage. Yields the members not running at the deadline."""
        eventually(lambda: not self._not_running(), start_timeout_s, _WATCH_S)  # the logs
        with self._lock:
            starting = self._not_running()
            self._held += 1
        try:
            yield starting
        finally:
            with self._lock:
                self._held -= 1

    def _wait_started(self, timeout_s: float) -> None:
        """Until every member still up has logged its start (bounded). A process SIGTERMed
        before its interpreter reached the handler (processor/cli/early_stop.py) dies of the
        signal, which says nothing about a clean stop: a member restarted by a kill a few ms
        before the end (faults that ran late come close together) would be."""

        def started() -> bool:
            with self._lock:
                up = [m for m in self.members if m.current.proc.poll() is None]
                return all(self._running(m) for m in up)

        eventually(started, timeout_s, _WATCH_S)  # polling the logs

    def _not_running(self) -> list[str]:
        """The members ended or not started yet (their start not logged)."""
        with self._lock:
            return [m.name for m in self.members if not self._running(m)]

    def _running(self, member: Member) -> bool:
        incarnation = member.current
        if incarnation.proc.poll() is not None:
            return False
        if not incarnation.started:
            with contextlib.suppress(OSError):
                incarnation.started = _STARTED[member.kind] in incarnation.log_path.read_bytes()
        return incarnation.started

    # -- faults ------------------------------------------------------------------------------

    def sigkill(self, kind: str) -> str | None:
        """SIGKILL a running member of ``kind`` chosen at random (an armed one only if no
        other runs: it is left to die at its fault point) and start it again at once;
        returns its name (None if none of that kind was running)."""
        with self._lock:
            running = [m for m in self.members if m.kind == kind and m.current.proc.poll() is None]
            if not running:
                return None
            member = self._rng.choice([m for m in running if not m.current.armed] or running)
            incarnation = member.current
            incarnation.proc.kill()
            incarnation.proc.wait(10)
            incarnation.handled = True
            self.kills[KILL_PROCESSOR if kind == PROCESSOR else KILL_WORKER] += 1
            self._on_fault(KILL_PROCESSOR if kind == PROCESSOR else KILL_WORKER, member.name)
            if not self._held:
                self._launch(member)
                self.restarts += 1
            return member.name

    def _watch_loop(self) -> None:
        while not self._stopping.wait(_WATCH_S):
            self.check()

    def check(self) -> None:
        """Count members that ended by themselves (an armed fault, or an unexpected exit) and
        start again every member that is down, unless restarts are held."""
        with self._lock:
            if self._stopping.is_set():
                return
            for member in self.members:
                if member.current.proc.poll() is None:
                    continue
                self._count_end(member)
                if not self._held:
                    self._launch(member)
                    self.restarts += 1

    def _count_end(self, member: Member) -> None:
        """Count how the member's current start ended, once: its armed fault, or an exit."""
        incarnation = member.current
        code = incarnation.proc.poll()
        if code is None or incarnation.handled:
            return
        incarnation.handled = True
        if incarnation.armed and code == -signal.SIGKILL:
            self.kills[KILL_AFTER_COMMIT] += 1
            self._on_fault(KILL_AFTER_COMMIT, member.name)
        else:
            self.exits.append(Exit(member.name, code, _tail(incarnation.log_path)))

    def _launch(self, member: Member) -> None:
        armed = ""
        first = member is self.members[0] and not member.incarnations
        arm = member.kind == PROCESSOR and self._armed_left > 0
        if arm and (first or self._rng.random() < self._arming.probability):
            self._armed_left -= 1
            armed = f"after_commit=kill@{self._rng.randint(*self._arming.commits)}"
        env = dict(self._env)
        env["DUCTOR_TEST_FAULTS"] = armed
        log_path = self._log_dir / f"{member.name}.{len(member.incarnations) + 1}.log"
        args = [PROCESSOR] if member.kind == PROCESSOR else [WORKER, *_WORKER_ARGS]
        proc = popen_ductor(args, env, log_path)
        member.incarnations.append(Incarnation(proc, log_path, armed))

    # -- figures -----------------------------------------------------------------------------

    def processor_stats(self) -> list[dict[str, Any]]:
        """The last stats of every processor incarnation (final if it stopped cleanly, else
        its last periodic line: a killed one's last second is missing)."""
        with self._lock:
            processors = [m for m in self.members if m.kind == PROCESSOR]
            paths = [i.log_path for m in processors for i in m.incarnations]
        found = (read_stats(path) for path in paths if path.exists())
        return [stats for stats in found if stats is not None]

    @property
    def incarnations(self) -> int:
        with self._lock:
            return sum(len(m.incarnations) for m in self.members)


def _tail(path: Path, lines: int = 8) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
