"""CPU time of processes, read from /proc, for the benchmark's CPU-per-tick figures.

A :class:`CpuMeter` takes a snapshot of some groups of processes at the start of a measured
window and another at its end; the difference is the CPU time (user + system, every thread)
each group spent in the window. A group is a few root processes (an instance, the broker's
JVM), optionally with every descendant (Postgres: the postmaster, its background processes
and its backends). Processes are told apart by (pid, start time), so a reused pid is a new
process.

For a tree, processes come and go during the window (a backend per connection): one that
appeared counts from zero; one that ended was reaped by its parent, whose ``cutime`` and
``cstime`` (CPU of waited-for children) then grew by the child's whole life, so the child's
CPU before the window is subtracted. What a child did between the window's start and its
end is therefore counted even though it is gone by the end.

Some members of a tree can be left out: a backend serving another database (another
developer's tests) or the benchmark's own session that polls progress. A left-out process
that ends during the window was reaped too, so its CPU as last seen is subtracted: the meter
samples the trees every ``sample_s`` (0.2 s) between start and stop to see it as late as it
can. What such a process did after its last sample, and the whole life of one that came and
went between two samples, still leaks into its parent's reaped time: nothing in /proc can
separate it.

Linux only; a figure that cannot be read is reported as unknown, never guessed.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")
PROC = Path("/proc")

_LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1", "0.0.0.0", "", "localhost.localdomain"}
# A backend's process title: "postgres: [cluster: ]user database host(port)|[local] activity".
_BACKEND_TITLE = re.compile(r"^postgres: (?:\S+: )?\S+ (\S+) (?:\S+\(\d+\)|\[local\])(?: |$)")


@dataclass(frozen=True)
class ProcStat:
    """The fields of /proc/<pid>/stat the meter uses; times in clock ticks."""

    pid: int
    comm: str
    state: str
    ppid: int
    utime: int
    stime: int
    cutime: int  # CPU of the children this process waited for (reaped), user mode
    cstime: int  # and system mode
    starttime: int  # clock ticks after boot: (pid, starttime) names one process

    @property
    def own(self) -> int:
        return self.utime + self.stime

    @property
    def reaped(self) -> int:
        return self.cutime + self.cstime


def parse_stat(text: str) -> ProcStat:
    """Parse a /proc/<pid>/stat line. The command name sits between the first "(" and the
    last ")" and may itself hold spaces and parentheses."""
    opening = text.index("(")
    closing = text.rindex(")")
    rest = text[closing + 2 :].split()
    # rest[0] is field 3 (state) of proc(5); field n is rest[n - 3].
    return ProcStat(
        pid=int(text[:opening]),
        comm=text[opening + 1 : closing],
        state=rest[0],
        ppid=int(rest[1]),
        utime=int(rest[11]),
        stime=int(rest[12]),
        cutime=int(rest[13]),
        cstime=int(rest[14]),
        starttime=int(rest[19]),
    )


def read_stat(pid: int, proc: Path = PROC) -> ProcStat | None:
    try:
        return parse_stat((proc / str(pid) / "stat").read_text())
    except (OSError, ValueError, IndexError):  # gone, or not a process
        return None


def read_cmdline(pid: int, proc: Path = PROC) -> str:
    try:
        return (proc / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except (OSError, UnicodeDecodeError):
        return ""


def all_stats(proc: Path = PROC) -> dict[int, ProcStat]:
    stats: dict[int, ProcStat] = {}
    for entry in proc.iterdir():
        if entry.name.isdigit():
            stat = read_stat(int(entry.name), proc)
            if stat is not None:
                stats[stat.pid] = stat
    return stats


def descendants(stats: Mapping[int, ProcStat], roots: Iterable[int]) -> set[int]:
    """``roots`` (those alive) and every process below them."""
    children: dict[int, list[int]] = {}
    for stat in stats.values():
        children.setdefault(stat.ppid, []).append(stat.pid)
    found: set[int] = set()
    pending = [r for r in roots if r in stats]
    while pending:
        pid = pending.pop()
        if pid not in found:
            found.add(pid)
            pending += children.get(pid, [])
    return found


def machine_busy_ticks(proc: Path = PROC) -> int:
    """CPU time the whole machine spent busy (every core, every user), in clock ticks."""
    fields = (proc / "stat").read_text().splitlines()[0].split()
    assert fields[0] == "cpu", fields[0]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[1:9])
    return user + nice + system + irq + softirq + steal


# -- finding the services' processes ---------------------------------------------------------


def listening_pids(port: int, proc: Path = PROC) -> set[int]:
    """The processes holding a TCP socket that listens on ``port`` (any address)."""
    inodes: set[str] = set()
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for line in (proc / "net" / table).read_text().splitlines()[1:]:
                cols = line.split()
                if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:  # LISTEN
                    inodes.add(f"socket:[{cols[9]}]")
    pids: set[int] = set()
    if not inodes:
        return pids
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (entry / "fd").iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd) in inodes:
                        pids.add(int(entry.name))
                        break
    return pids


def _topmost(pids: set[int], proc: Path = PROC) -> int | None:
    """The one of ``pids`` whose parent is not among them (a server, not its children)."""
    tops = [p for p in pids if (s := read_stat(p, proc)) is not None and s.ppid not in pids]
    return tops[0] if len(tops) == 1 else None


def _is_local(host: str) -> bool:
    return host in _LOCAL_HOSTS or host == socket.gethostname()


def _only(pids: Sequence[int]) -> int | None:
    return pids[0] if len(pids) == 1 else None


def _listening_broker(server: str, proc: Path = PROC) -> int | None:
    """The pid of the Kafka broker listening on ``server`` (host:port) on this machine."""
    host, _, port = server.strip().rpartition(":")
    if not _is_local(host.strip("[]")) or not port.isdigit():
        return None
    pid = _topmost(listening_pids(int(port), proc), proc)
    return pid if pid is not None and "kafka" in read_cmdline(pid, proc).lower() else None


def find_broker(bootstrap_servers: str, proc: Path = PROC) -> int | None:
    """The pid of the Kafka broker behind ``bootstrap_servers`` when it runs on this machine:
    the process listening on its port, else the only JVM running ``kafka.Kafka``."""
    first = bootstrap_servers.split(",", maxsplit=1)[0]
    host, _, port = first.strip().rpartition(":")
    if not _is_local(host.strip("[]")) or not port.isdigit():
        return None
    pid = _listening_broker(first, proc)
    if pid is not None:
        return pid
    return _only([p for p in _pids(proc) if "kafka.Kafka" in read_cmdline(p, proc).split()])


def find_brokers(bootstrap_servers: str, proc: Path = PROC) -> tuple[int, ...]:
    """The pids of the brokers behind ``bootstrap_servers`` running on this machine, one per
    server listed (a cluster's nodes); ``find_broker``'s guess when none listens here."""
    found: list[int] = []
    for server in bootstrap_servers.split(","):
        pid = _listening_broker(server, proc)
        if pid is not None and pid not in found:
            found.append(pid)
    if found:
        return tuple(found)
    single = find_broker(bootstrap_servers, proc)
    return (single,) if single else ()


def find_postmaster(host: str, port: int, proc: Path = PROC) -> int | None:
    """The pid of the Postgres postmaster serving ``host:port`` when it runs on this
    machine: the process listening on the port (backends close the listening sockets)."""
    if not (_is_local(host) or host.startswith("/")):
        return None
    pid = _topmost(listening_pids(port, proc), proc)
    if pid is not None and "postgres" in read_cmdline(pid, proc):
        return pid
    return None


def _pids(proc: Path) -> list[int]:
    return [int(e.name) for e in proc.iterdir() if e.name.isdigit()]


def backend_database(title: str) -> str | None:
    """The database a Postgres backend serves, from its process title; None for a
    background process (checkpointer, WAL writer, autovacuum, ...)."""
    match = _BACKEND_TITLE.match(title)
    return match.group(1) if match else None


def other_sessions(database: str, own_backends: Iterable[int]) -> Callable[[int, str], bool]:
    """A filter leaving out the backends of other databases and ``own_backends``."""
    own = set(own_backends)

    def excluded(pid: int, title: str) -> bool:
        if pid in own:
            return True
        db = backend_database(title)
        return db is not None and db != database

    return excluded


# -- the meter -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Group:
    """Processes measured together: ``roots`` alone, or with every descendant (``tree``).
    ``exclude(pid, title)`` leaves members of a tree out (see the module's docstring)."""

    name: str
    roots: tuple[int, ...]
    tree: bool = False
    exclude: Callable[[int, str], bool] | None = None


Key = tuple[int, int]  # (pid, starttime): one process, even if its pid is reused
# key -> (own ticks, reaped ticks, left out)
Members = dict[Key, tuple[int, int, bool]]


def snapshot_group(
    group: Group,
    stats: Mapping[int, ProcStat],
    proc: Path = PROC,
    left_out: dict[Key, bool] | None = None,
) -> Members:
    """The group's members now. ``left_out`` caches the exclusion per process (a process
    title is read once per process, not at every sample)."""
    pids = descendants(stats, group.roots) if group.tree else set(group.roots)
    cache = {} if left_out is None else left_out
    members: Members = {}
    for pid in pids:
        stat = stats.get(pid) if group.tree else read_stat(pid, proc)
        if stat is None:
            continue
        key = (pid, stat.starttime)
        if key not in cache:
            cache[key] = group.exclude is not None and group.exclude(pid, read_cmdline(pid, proc))
        members[key] = (stat.own, stat.reaped, cache[key])
    return members


def group_delta(start: Members, end: Members, tree: bool, seen: Members | None = None) -> int:
    """CPU ticks a group spent between two snapshots (see the module's docstring); ``seen``
    holds each member of a tree as last sampled in between."""
    last = {**start, **(seen or {})}
    total = 0
    for key, (own, reaped, left_out) in end.items():
        if left_out or (key in start and start[key][2]):
            continue
        before = start.get(key, (0, 0, False))
        total += own - before[0] + ((reaped - before[1]) if tree else 0)
    if tree:
        for key, (own, reaped, left_out) in last.items():
            if key in end:
                continue
            # Ended and reaped: its whole life is now in its parent's reaped time. Ours
            # counts from the window's start (or from zero if it began in it); one left out
            # is taken out as far as it was seen.
            if left_out:
                total -= own + reaped
            elif key in start:
                total -= start[key][0] + start[key][1]
    return total


@dataclass
class CpuUse:
    """CPU seconds per group over a window (None: the group's processes were not found),
    the machine's busy CPU seconds (every core, every user) and the window's wall time."""

    seconds: dict[str, float | None]
    machine: float
    wall: float


class CpuMeter:
    """Snapshots at ``start`` and ``stop``, and samples of the trees every ``sample_s`` in
    between (on a thread of its own) to see processes that end before the stop. The
    sampling thread's own CPU is not counted in a group holding this process."""

    def __init__(self, groups: Sequence[Group], proc: Path = PROC, sample_s: float = 0.2) -> None:
        self.groups = list(groups)
        self.proc = proc
        self.sample_s = sample_s
        self._left_out: dict[str, dict[Key, bool]] = {g.name: {} for g in self.groups}
        self._start: dict[str, Members] = {}
        self._seen: dict[str, Members] = {}
        self._machine = 0
        self._wall = 0.0
        self._stop = threading.Event()
        self._sampler: threading.Thread | None = None
        self._sampler_cpu = 0.0  # seconds

    def _snapshot(self, trees_only: bool = False) -> dict[str, Members]:
        groups = [g for g in self.groups if g.tree or not trees_only]
        stats = all_stats(self.proc) if any(g.tree for g in groups) else {}
        return {g.name: snapshot_group(g, stats, self.proc, self._left_out[g.name]) for g in groups}

    def sample(self) -> None:
        """Note every member of the trees as it is now."""
        for name, members in self._snapshot(trees_only=True).items():
            self._seen[name].update(members)

    def _sample_until_stopped(self) -> None:
        while not self._stop.wait(self.sample_s):
            self.sample()
        self._sampler_cpu = time.thread_time()  # this thread's whole CPU time

    def start(self) -> None:
        self._wall = time.monotonic()
        self._machine = machine_busy_ticks(self.proc)
        self._start = self._snapshot()
        self._seen = {name: {} for name in self._start}
        self._sampler_cpu = 0.0
        if self.sample_s > 0 and any(g.tree and g.roots for g in self.groups):
            self._stop.clear()
            self._sampler = threading.Thread(
                target=self._sample_until_stopped, name="cpu-sampler", daemon=True
            )
            self._sampler.start()

    def stop(self) -> CpuUse:
        if self._sampler is not None:
            self._stop.set()
            self._sampler.join()
            self._sampler = None
        end = self._snapshot()
        machine = machine_busy_ticks(self.proc) - self._machine
        wall = time.monotonic() - self._wall
        seconds: dict[str, float | None] = {}
        for group in self.groups:
            if not group.roots:
                seconds[group.name] = None
                continue
            name = group.name
            ticks = group_delta(self._start[name], end[name], group.tree, self._seen[name])
            own = self._sampler_cpu if os.getpid() in group.roots and not group.tree else 0.0
            seconds[name] = max(0.0, ticks / CLK_TCK - own)
        return CpuUse(seconds, machine / CLK_TCK, wall)
