"""End to end, this checkout against another revision of the project, alternating:

    python -m processor.tools.bench_trees a941da2 --processes 2 --rounds 6

How issue 17's bound is measured (the task-queue worker's tree against the batch worker's it
replaced, a941da2): one `make bench` runs one tree, and the machine moves by ±30 % between
runs, so the two trees run in turns, each round on a database created empty for it, and the
ratio is that of the medians.

Each run is the end-to-end phase of that tree's own benchmark (its ``Bench.end_to_end``: its
processors and workers, 8,000 runs of the 4-step workflow by default) in a child process
whose imports come from that tree (``PYTHONPATH``). The other revision is checked out into a
temporary git worktree, removed afterwards; it is not built, so its modules are pure Python.
This checkout's are what it has (compiled after `make compile`). Needs a git checkout, the
local services up (`make up`) and a revision whose benchmark has ``Bench.end_to_end``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from processor.io.config.settings import load_settings
from processor.tools.bench_harness import fresh_database
from processor.tools.bench_rounds import Round, compare, turns
from processor.tools.bench_support import GROUPS

CHECKOUT = Path(__file__).resolve().parents[2]

# What the child runs, with the other tree's modules: its own end-to-end phase, on the
# database the parent made for it (DUCTOR_PG_DSN), its figures as one line of JSON. Only names
# every tree has: the package's public load_settings (modules move between revisions).
_CHILD = """
import json, sys
from processor import load_settings
from processor.tools.bench_phases import Bench
processes, runs = int(sys.argv[1]), int(sys.argv[2])
bench = Bench(load_settings(), 1.0)
bench.setup()
try:
    bench.phase(f"e2e{processes}")
    cost = bench.end_to_end(processes, processes, runs)["cost"]
finally:
    bench.teardown()
print(json.dumps({"seconds": cost.seconds, "cpu": cost.cpu.seconds}))
"""


def run_tree(label: str, tree: Path, processes: int, runs: int) -> Round:
    """The end-to-end phase of ``tree``'s benchmark, on a database created empty for it."""
    settings = fresh_database(load_settings())
    # This environment with only the database changed: the other tree reads its settings
    # itself (this tree's full settings may name variables it does not know, or refuses).
    env = {k: v for k, v in os.environ.items() if k != "DUCTOR_PG_DSN_FILE"}
    env["DUCTOR_PG_DSN"] = settings.pg_dsn
    env["PYTHONPATH"] = str(tree)
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(processes), str(runs)],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(
            f"{label}: the end-to-end phase failed (exit {done.returncode}):\n"
            + (done.stderr.strip()[-2000:] or done.stdout.strip()[-2000:])
        )
    figures = json.loads(lines[-1])
    return Round(label, runs, figures["seconds"], figures["cpu"])


def worktree(revision: str, where: Path) -> Path:
    """``revision`` checked out at ``where`` (a git worktree of this checkout)."""
    try:
        subprocess.run(
            ["git", "-C", str(CHECKOUT), "worktree", "add", "--detach", str(where), revision],
            check=True,
            capture_output=True,
            text=True,
        )
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", "") or str(exc)
        raise SystemExit(
            f"cannot check out {revision!r} beside {CHECKOUT} (a git checkout is needed): "
            f"{detail.strip()}"
        ) from exc
    return where


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_trees", description=__doc__.split("\n")[0])
    parser.add_argument("revision", help="the other tree: a git revision (a941da2, HEAD~3)")
    parser.add_argument("--processes", type=int, nargs="+", default=[2], help="1, 2 or both")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--runs", type=int, default=8000, help="runs of the 4-step workflow")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.runs < 1 or any(p < 1 for p in args.processes):
        parser.error("--rounds, --runs and --processes must be at least 1")
    this, other = "this checkout", args.revision
    with tempfile.TemporaryDirectory(prefix="ductor-bench-tree-") as scratch:
        tree = worktree(args.revision, Path(scratch) / "tree")
        try:
            for processes in args.processes:
                results: list[Round] = []
                trees = {other: tree, this: CHECKOUT}
                for round_, label in turns(args.rounds, other, this):
                    run = run_tree(label, trees[label], processes, args.runs)
                    results.append(run)
                    groups = ", ".join(
                        f"{group} {run.cpu_per_run_us(group):,.0f}"
                        for group in GROUPS
                        if run.cpu.get(group) is not None
                    )
                    print(
                        f"{processes} + {processes}, round {round_ + 1}, {label}:"
                        f" {run.runs_per_s:,.0f} runs/s,"
                        f" {run.cpu_per_run_us():,.0f} µs of CPU per run ({groups})",
                        flush=True,
                    )
                found = compare(results, this, other)
                print(
                    f"{processes} + {processes}: this checkout {found.this_median:,.0f} runs/s"
                    f" ({found.this_cpu_us:,.0f} µs per run), {other}"
                    f" {found.other_median:,.0f} ({found.other_cpu_us:,.0f} µs);"
                    f" ratio of medians {found.ratio:.2f}",
                    flush=True,
                )
        finally:
            subprocess.run(
                ["git", "-C", str(CHECKOUT), "worktree", "remove", "--force", str(tree)],
                check=False,
                capture_output=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
