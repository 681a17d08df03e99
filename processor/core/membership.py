"""Whether a group member is stuck: it holds nothing, or reads nothing, while records wait
for it.

A member can fall out of step with its group and never notice: after a broker restart a worker
was seen holding no partition for 90 s while its topic had lag (the broker counted the
partitions as the member's; the client had none). Nothing fails, so nothing retries; only
joining again, with a new client, ends it.

Two parts. ``IdleWatch`` is fed every loop turn with whether a record came; once none has
come for ``after_s`` it asks for a look at the group as the broker sees it (a spare member of
an idle queue is idle too, so idleness alone proves nothing). ``judge`` reads that look with
what the member holds: records waiting on a partition that the broker gives this member (as
its assignment, or as the target it is to reconcile to) but the member does not hold, or that
the member holds, reads and has not fetched, mean it is stuck. Records waiting on another
member's partitions are that member's, and a partition no member holds is the group
coordinator's to give (right after a broker restart many are, for a few seconds: a member
that joined again then only added to the churn, as the chaos run showed). The shell acts only
on a verdict that a second look confirms a few seconds later.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass, field

from processor.core.shapes import TopicPartition


@dataclass(frozen=True)
class GroupView:
    """The group as the broker sees it: per partition of the member's topics, the offset the
    group committed (or the partition's start, with no commit) and the end, which member holds
    it (``owners``) and which member the coordinator means it for (``targets``: its target
    assignment, which the member reconciles to; the consumer protocol only)."""

    committed: Mapping[TopicPartition, int]
    ends: Mapping[TopicPartition, int]
    owners: Mapping[TopicPartition, str]
    targets: Mapping[TopicPartition, str] = field(default_factory=dict)

    def waiting(self) -> dict[TopicPartition, int]:
        """Partitions with records past the committed offset, and how many."""
        return {
            tp: end - self.committed.get(tp, end)
            for tp, end in self.ends.items()
            if end > self.committed.get(tp, end)
        }


@dataclass(frozen=True)
class Holding:
    """What this member holds, as its own client says: its member id, the partitions it
    holds, those it reads (held and not paused), and its fetch position in each it reads."""

    member_id: str
    held: Set[TopicPartition]
    reading: Set[TopicPartition]
    positions: Mapping[TopicPartition, int]


@dataclass(frozen=True)
class Stuck:
    """Records wait that this member should be reading: ``reason`` says which and why."""

    reason: str
    waiting: int  # records waiting on those partitions


def judge(view: GroupView, holding: Holding) -> Stuck | None:
    """Whether ``holding`` shows a stuck member, given the group's ``view`` (None: it is not,
    as far as its own partitions go)."""
    me = holding.member_id
    mine: list[TopicPartition] = []  # the broker's for this member, not held here
    unread: list[TopicPartition] = []  # held and read here, nothing fetched
    waiting = view.waiting()
    for tp in sorted(waiting):
        if tp in holding.held:
            position = holding.positions.get(tp, -1)
            if tp in holding.reading and position < view.ends[tp]:
                unread.append(tp)
        elif me in (view.owners.get(tp), view.targets.get(tp)):
            mine.append(tp)
    reasons = []
    if mine:
        reasons.append(f"the group gives it {_tps(mine)}, which it does not hold")
    if unread:
        reasons.append(f"it holds {_tps(unread)} but fetches nothing from them")
    if not reasons:
        return None
    count = sum(waiting[tp] for tp in (*mine, *unread))
    return Stuck("; ".join(reasons), count)


def _tps(tps: list[TopicPartition]) -> str:
    shown = ", ".join(f"{t}[{p}]" for t, p in tps[:4])
    return shown + (f" and {len(tps) - 4} more" if len(tps) > 4 else "")


class IdleWatch:
    """When to look at the group: after ``after_s`` with no record taken, then again every
    ``after_s`` while none comes (a look that finds nothing wrong is not repeated sooner)."""

    def __init__(self, after_s: float, now: float) -> None:
        self.after_s = after_s
        self._quiet_since = now

    def turn(self, now: float, took: bool) -> bool:
        """A loop turn (``took``: a record came); True when a look is due."""
        if took:
            self._quiet_since = now
            return False
        return now - self._quiet_since >= self.after_s

    def looked(self, now: float) -> None:
        """A look was taken (or tried): the next is due ``after_s`` from now."""
        self._quiet_since = now
