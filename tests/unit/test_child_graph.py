"""Cycles of child workflows (core/child_graph.py): which registrations would close one, how
versions figure (a pinned version, the latest for an unpinned one), and (Hypothesis) the cycle
found is a real one, and one is found whenever the versions reachable from the new one are not
a DAG."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from graphlib import CycleError, TopologicalSorter
from itertools import pairwise

from hypothesis import given
from hypothesis import strategies as st

from processor.core.child_graph import ChildCycle, ChildRef, child_cycle, child_refs, describe_cycle
from processor.core.shapes import WorkflowKey
from processor.core.workflow import parse_workflow

Graph = dict[WorkflowKey, list[ChildRef]]


def test_a_workflow_that_starts_its_starter_closes_a_cycle() -> None:
    # B v1 plain; A v1 starts B (latest); B v2 starts A (latest): B v2 -> A v1 -> B v2.
    graph: Graph = {("B", 1): [], ("A", 1): [("B", None)], ("B", 2): [("A", None)]}
    assert child_cycle(("B", 2), graph) == [("B", 2), ("A", 1), ("B", 2)]
    assert describe_cycle([("B", 2), ("A", 1), ("B", 2)]) == "B v2 -> A v1 -> B v2"


def test_a_longer_cycle_and_a_cycle_beyond_the_new_version_are_found() -> None:
    graph: Graph = {
        ("C", 1): [],
        ("B", 1): [("C", None)],
        ("A", 1): [("B", None)],
        ("C", 2): [("A", 1)],
    }
    assert child_cycle(("C", 2), graph) == [("C", 2), ("A", 1), ("B", 1), ("C", 2)]
    # A new workflow that only reaches a cycle left from before is refused too.
    graph[("D", 1)] = [("A", None)]
    assert child_cycle(("D", 1), graph) == [("A", 1), ("B", 1), ("C", 2), ("A", 1)]


def test_a_pinned_version_leads_only_to_that_version() -> None:
    # B v2 starts A pinned at v1, which starts B pinned at v1 (no child): no cycle.
    graph: Graph = {("B", 1): [], ("A", 1): [("B", 1)], ("B", 2): [("A", 1)]}
    assert child_cycle(("B", 2), graph) is None
    # Unpinned, A v1's step leads to B's latest, B v2: a cycle.
    graph[("A", 1)] = [("B", None)]
    assert child_cycle(("B", 2), graph) is not None


def test_an_old_version_that_is_not_the_latest_draws_no_unpinned_step_to_it() -> None:
    # B v3 is the latest; registering B v2 (which starts A) later: A's unpinned step leads to
    # v3, not v2, so no cycle.
    graph: Graph = {("B", 3): [], ("A", 1): [("B", None)], ("B", 2): [("A", None)]}
    assert child_cycle(("B", 2), graph) is None


def test_a_diamond_is_no_cycle_and_an_unregistered_version_leads_nowhere() -> None:
    graph: Graph = {
        ("D", 1): [],
        ("B", 1): [("D", None)],
        ("C", 1): [("D", None)],
        ("A", 1): [("B", None), ("C", None), ("E", 7)],
    }
    assert child_cycle(("A", 1), graph) is None


def test_the_children_a_definition_starts_and_the_refusal_names_the_cycle() -> None:
    wf = parse_workflow(
        {
            "name": "order",
            "version": 2,
            "steps": [
                {"name": "a", "type": "a"},
                {"name": "ship", "kind": "workflow", "workflow": "shipping"},
                {"name": "bill", "kind": "workflow", "workflow": "billing", "version": 3},
            ],
        }
    )
    assert child_refs(wf) == (("shipping", None), ("billing", 3))
    refused = ChildCycle(("order", 2), [("order", 2), ("shipping", 1), ("order", 2)])
    assert "order v2 -> shipping v1 -> order v2" in str(refused)
    assert isinstance(refused, ValueError)


def _resolve(graph: Mapping[WorkflowKey, Sequence[ChildRef]], ref: ChildRef) -> WorkflowKey | None:
    name, version = ref
    if version is None:
        versions = [v for n, v in graph if n == name]
        version = max(versions) if versions else None
    return None if version is None or (name, version) not in graph else (name, version)


_KEYS = st.tuples(st.sampled_from("ABCD"), st.integers(1, 3))
_GRAPHS = st.dictionaries(
    _KEYS,
    st.lists(st.tuples(st.sampled_from("ABCDE"), st.none() | st.integers(1, 3)), max_size=3),
    min_size=1,
    max_size=8,
)


@given(_GRAPHS, st.data())
def test_a_cycle_is_found_exactly_when_the_reachable_versions_are_not_a_dag(
    graph: Graph, data: st.DataObject
) -> None:
    start = data.draw(st.sampled_from(sorted(graph)))
    found = child_cycle(start, graph)
    # The versions reachable from ``start``, and whether they sort (no cycle among them).
    reachable, todo = {start}, [start]
    while todo:
        for ref in graph[todo.pop()]:
            target = _resolve(graph, ref)
            if target is not None and target not in reachable:
                reachable.add(target)
                todo.append(target)
    edges = {k: {t for r in graph[k] if (t := _resolve(graph, r)) is not None} for k in reachable}
    try:
        tuple(TopologicalSorter(edges).static_order())
        acyclic = True
    except CycleError:
        acyclic = False
    assert (found is None) == acyclic
    if found is not None:
        assert found[0] == found[-1] and len(set(found[:-1])) == len(found) - 1
        for here, there in pairwise(found):
            assert there in edges[here]
