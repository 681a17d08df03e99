"""The idle-latency phase's arithmetic: one run's hops from its recorded times."""

from __future__ import annotations

import pytest

from processor.tools.latency_figures import HOPS, Percentiles, RunTimes, hops_of, summarise


def _run(offset: float = 0.0) -> RunTimes:
    # s0 dispatched 10 ms after the row's creation; s1 and s2 3 ms apart; s3 after s2's result.
    def at(ms: float) -> float:
        return 1_000_000.0 + offset + ms

    return RunTimes(
        started=at(-2),
        seen=at(120),
        created=at(0),
        ended=at(100),
        dispatched={"s0": at(10), "s1": at(40), "s2": at(43), "s3": at(80)},
        claimed={"s0": at(15), "s1": at(45), "s2": at(50), "s3": at(85)},
        recorded={"s0": at(20), "s1": at(55), "s2": at(60), "s3": at(90)},
    )


def test_one_runs_hops() -> None:
    hops = hops_of(_run())
    assert hops == {
        "start -> first dispatch": 10,
        "dispatch -> claim": 5 + 5 + 7 + 5,
        "claim -> result recorded": 5 + 10 + 10 + 5,
        "result -> next dispatch": (40 - 20) + (80 - 60),
        "parallel dispatch skew": 3,
        "last result -> run ended": 10,
        "run ended -> client saw it": 20,
    }
    assert list(hops) == list(HOPS)


def test_the_summary_takes_percentiles_over_runs() -> None:
    summary = summarise([_run(i * 1000.0) for i in range(10)])
    assert summary.runs == 10
    assert summary.client.p50 == pytest.approx(122)
    assert summary.engine.p99 == pytest.approx(100)
    assert summary.hops["parallel dispatch skew"].p90 == pytest.approx(3)


def test_percentiles_of_a_spread() -> None:
    p = Percentiles.of([float(x) for x in range(1, 101)])
    assert (p.p50, p.p90, p.p99) == (50.5, 91.0, 100.0)
