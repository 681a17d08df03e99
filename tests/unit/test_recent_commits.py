"""The runs committed just before a database restart are woken again once, by whichever
connection meets the new server first (engine/recent_commits.py)."""

from __future__ import annotations

from processor.engine.recent_commits import RecentCommits


def test_nothing_is_woken_until_a_connection_meets_a_server_started_anew() -> None:
    recent = RecentCommits(window_s=5.0)
    assert recent.met("start-1") == []  # the first server met: nothing to say
    recent.add(10.0, [("a", "t1"), ("b", "t2")])
    assert recent.met("start-1") == []  # another connection, the same server
    assert recent.met("start-2") == [("a", "t1"), ("b", "t2")]
    assert recent.met("start-2") == []  # the other connection meets it too: taken once


def test_a_run_committed_twice_is_woken_once_and_old_commits_are_forgotten() -> None:
    recent = RecentCommits(window_s=5.0)
    recent.met("start-1")
    recent.add(0.0, [("old", "t1")])
    recent.add(3.0, [("a", "t1")])
    recent.add(6.0, [("a", "t1"), ("b", "t0")])  # "old" is more than 5 s older: gone
    assert recent.met("start-2") == [("a", "t1"), ("b", "t0")]
    recent.add(7.0, [("c", "t1")])  # committed on the new server, kept for the next restart
    assert recent.met("start-3") == [("c", "t1")]
