"""The benchmark's CPU accounting (processor/tools/bench_cpu.py): parsing /proc, on this test
process and on a fake /proc tree where processes start, end and serve other databases."""

from __future__ import annotations

import os
from pathlib import Path

from processor.tools.bench_cpu import (
    CLK_TCK,
    CpuMeter,
    Group,
    backend_database,
    find_postmaster,
    listening_pids,
    other_sessions,
    parse_stat,
    read_cmdline,
    read_stat,
)


def _stat_line(
    pid: int,
    comm: str,
    ppid: int,
    utime: int,
    stime: int,
    cutime: int = 0,
    cstime: int = 0,
    starttime: int = 1000,
) -> str:
    """A /proc/<pid>/stat line as the kernel writes it (52 fields)."""
    fields = ["S", ppid, pid, pid, 0, -1, 4194304, 10, 0, 0, 0, utime, stime, cutime, cstime]
    fields += [20, 0, 1, 0, starttime, 1000000, 100] + [0] * 30
    return f"{pid} ({comm}) " + " ".join(str(f) for f in fields) + "\n"


def test_a_command_name_with_spaces_and_parentheses_is_read_whole() -> None:
    line = _stat_line(4242, "post (gres) x) y", 17, 123, 45, 6, 7, starttime=98765)
    stat = parse_stat(line)
    assert stat.pid == 4242
    assert stat.comm == "post (gres) x) y"
    assert stat.state == "S"
    assert stat.ppid == 17
    assert (stat.utime, stat.stime, stat.cutime, stat.cstime) == (123, 45, 6, 7)
    assert stat.starttime == 98765
    assert (stat.own, stat.reaped) == (168, 13)


def test_the_test_process_reads_as_itself_with_the_cpu_the_kernel_reports() -> None:
    before = os.times()
    stat = read_stat(os.getpid())
    after = os.times()
    assert stat is not None
    assert stat.pid == os.getpid()
    assert stat.ppid == os.getppid()
    assert stat.state in "RS"
    # Both come from the same kernel accounting, in clock ticks (truncated each way).
    tick = 1 / CLK_TCK
    assert before.user + before.system - 2 * tick <= stat.own / CLK_TCK
    assert stat.own / CLK_TCK <= after.user + after.system + 2 * tick
    assert "python" in read_cmdline(os.getpid())


def test_a_process_that_is_gone_reads_as_none() -> None:
    assert read_stat(2**22 + 12345) is None


def test_backend_titles_name_their_database_and_background_processes_none() -> None:
    assert backend_database("postgres: ductor ductor_bench 127.0.0.1(37616) idle") == (
        "ductor_bench"
    )
    assert backend_database("postgres: main: ductor other [local] UPDATE") == "other"
    assert backend_database("postgres: ductor ductor 127.0.0.1(34838)") == "ductor"
    for title in (
        "postgres: checkpointer",
        "postgres: walwriter",
        "postgres: autovacuum launcher",
        "postgres: logical replication launcher",
        "postgres: background writer",
        "/usr/lib/postgresql/15/bin/postgres -D /data",
    ):
        assert backend_database(title) is None
    excluded = other_sessions("ductor_bench", [99])
    assert excluded(99, "postgres: ductor ductor_bench 127.0.0.1(1) idle")
    assert excluded(98, "postgres: ductor ductor 127.0.0.1(1) idle")
    assert not excluded(98, "postgres: ductor ductor_bench 127.0.0.1(1) idle")
    assert not excluded(98, "postgres: walwriter")


class FakeProc:
    """A /proc with stat and cmdline files, a CPU line and a listening socket."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.busy = 0
        self.write_machine()

    def write_machine(self) -> None:
        # user nice system idle iowait irq softirq steal guest guest_nice
        line = f"cpu  {self.busy} 0 0 5000 0 0 0 0 0 0\ncpu0 0 0 0 0 0 0 0 0 0 0\n"
        (self.root / "stat").write_text(line)

    def process(
        self, pid: int, ppid: int, own: int, reaped: int = 0, title: str = "", start: int = 1
    ) -> None:
        directory = self.root / str(pid)
        directory.mkdir(exist_ok=True)
        comm = title.split(maxsplit=1)[0] if title else "x"
        line = _stat_line(pid, comm, ppid, own, 0, reaped, 0, start)
        (directory / "stat").write_text(line)
        (directory / "cmdline").write_bytes(title.replace(" ", "\0").encode() + b"\0")

    def end(self, pid: int) -> None:
        for name in ("stat", "cmdline"):
            (self.root / str(pid) / name).unlink()
        (self.root / str(pid)).rmdir()


def test_a_tree_counts_children_that_came_and_went_and_leaves_out_other_databases(
    tmp_path: Path,
) -> None:
    proc = FakeProc(tmp_path)
    title = "postgres: ductor {} 127.0.0.1(5) idle"
    proc.process(1, 0, own=5, title="init")
    proc.process(100, 1, own=1000, reaped=50, title="/usr/bin/postgres -D /data")
    proc.process(101, 100, own=200, title="postgres: walwriter")
    proc.process(102, 100, own=300, title=title.format("bench"))  # ends in the window
    proc.process(103, 100, own=400, title=title.format("other"))  # another database
    proc.process(104, 100, own=500, title=title.format("bench"))  # the benchmark's own
    proc.process(7, 1, own=70, title="python -m processor process")
    excluded = other_sessions("bench", [104])
    meter = CpuMeter(
        [Group("pg", (100,), tree=True, exclude=excluded), Group("inst", (7,))],
        proc=tmp_path,
        sample_s=0,
    )
    proc.busy = 1000
    proc.write_machine()
    meter.start()

    # In the window: the walwriter works 20 ticks; backend 102 works 30 more, then ends and
    # is reaped (its 330 go into the postmaster's cutime); backend 105 starts and works 40,
    # and 106 starts and ends (reaped with 15); the postmaster works 10; the other
    # database's backend works 1000 and the benchmark's session 60: neither counts.
    proc.process(101, 100, own=220, title="postgres: walwriter")
    proc.end(102)
    proc.process(100, 1, own=1010, reaped=50 + 330 + 15, title="/usr/bin/postgres -D /data")
    proc.process(105, 100, own=40, title=title.format("bench"), start=9)
    proc.process(103, 100, own=1400, title=title.format("other"))
    proc.process(104, 100, own=560, title=title.format("bench"))
    proc.process(7, 1, own=95, title="python -m processor process")
    proc.process(8, 1, own=999, title="unrelated")
    proc.busy = 1500
    proc.write_machine()
    use = meter.stop()

    assert use.seconds["pg"] == (20 + 30 + 40 + 15 + 10) / CLK_TCK
    assert use.seconds["inst"] == 25 / CLK_TCK
    assert use.machine == 500 / CLK_TCK
    assert use.wall >= 0


def test_a_reused_pid_is_a_new_process(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path)
    proc.process(100, 1, own=10, title="/usr/bin/postgres -D /data")
    proc.process(101, 100, own=500, title="postgres: ductor db 127.0.0.1(5) idle", start=3)
    meter = CpuMeter([Group("pg", (100,), tree=True)], proc=tmp_path, sample_s=0)
    meter.start()
    # 101 ended (reaped with 520) and a new process got its pid, with 7 ticks so far.
    proc.process(100, 1, own=10, reaped=520, title="/usr/bin/postgres -D /data")
    proc.process(101, 100, own=7, title="postgres: ductor db 127.0.0.1(6) idle", start=50)
    assert meter.stop().seconds["pg"] == (20 + 7) / CLK_TCK


def test_a_left_out_backend_that_ends_is_taken_out_as_far_as_it_was_sampled(
    tmp_path: Path,
) -> None:
    proc = FakeProc(tmp_path)
    other = "postgres: ductor other 127.0.0.1(5) idle"
    proc.process(100, 1, own=10, title="/usr/bin/postgres -D /data")
    proc.process(101, 100, own=100, title=other)
    meter = CpuMeter(
        [Group("pg", (100,), tree=True, exclude=other_sessions("bench", []))],
        proc=tmp_path,
        sample_s=0,
    )
    meter.start()
    # 101 works 50, a backend of the other database starts (102) and works 30: a sample sees
    # them; then 101 works 5 more and 102 20 more, both end and are reaped (155 and 50).
    proc.process(101, 100, own=150, title=other)
    proc.process(102, 100, own=30, title=other, start=7)
    meter.sample()
    proc.end(101)
    proc.end(102)
    proc.process(100, 1, own=12, reaped=155 + 50, title="/usr/bin/postgres -D /data")
    # The postmaster's own 2, plus what the sample could not see (5 + 20) leaking through.
    assert meter.stop().seconds["pg"] == (2 + 5 + 20) / CLK_TCK


def test_the_sampler_thread_runs_between_start_and_stop(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path)
    proc.process(100, 1, own=10, title="/usr/bin/postgres -D /data")
    meter = CpuMeter([Group("pg", (100,), tree=True)], proc=tmp_path, sample_s=0.01)
    meter.start()
    proc.process(100, 1, own=13, title="/usr/bin/postgres -D /data")
    assert meter.stop().seconds["pg"] == 3 / CLK_TCK
    assert meter.stop().seconds["pg"] == 3 / CLK_TCK  # stopping again measures the same


def test_a_group_without_processes_is_unknown(tmp_path: Path) -> None:
    FakeProc(tmp_path)
    meter = CpuMeter([Group("broker", ())], proc=tmp_path, sample_s=0)
    meter.start()
    assert meter.stop().seconds == {"broker": None}


def test_the_postmaster_is_the_process_listening_on_the_port(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path)
    proc.process(100, 1, own=1, title="/usr/bin/postgres -D /data")
    proc.process(101, 100, own=1, title="postgres: walwriter")
    net = tmp_path / "net"
    net.mkdir()
    header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid"
    header += "  timeout inode\n"
    rows = [  # port 55432 = 0xD888, listening (0A); the same port connected (01) elsewhere
        "   0: 0100007F:D888 00000000:0000 0A 00000000:00000000 00:00000000 00000000 101 0 777 1",
        "   1: 0100007F:D888 0100007F:9999 01 00000000:00000000 00:00000000 00000000 101 0 778 1",
    ]
    (net / "tcp").write_text(header + "\n".join(rows) + "\n")
    for pid, inode in ((100, 777), (101, 778)):
        fds = tmp_path / str(pid) / "fd"
        fds.mkdir()
        (fds / "3").symlink_to(f"socket:[{inode}]")
        (fds / "4").symlink_to("/dev/null")
    assert listening_pids(55432, tmp_path) == {100}
    assert listening_pids(5432, tmp_path) == set()
    assert find_postmaster("127.0.0.1", 55432, tmp_path) == 100
    assert find_postmaster("db.example.com", 55432, tmp_path) is None
