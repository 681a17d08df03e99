"""The Grafana dashboard and the Prometheus rules as files (tests/integration/test_dashboards.py
checks their names against a real /metrics): the name extractor on sample expressions, the
check that finds a misspelt metric or label, and the shape Grafana and Prometheus expect."""

from __future__ import annotations

from typing import Any

import pytest

from tests.promql import (
    Names,
    Query,
    dashboard_queries,
    load_dashboard,
    load_rules,
    names_in,
    problems,
    rule_queries,
)

EXAMPLES = [
    (
        'sum by (ductor_outcome) (rate(ductor_ticks_total{job=~"$job"}[$__rate_interval]))',
        {"ductor_ticks_total"},
        {"ductor_outcome", "job"},
    ),
    (
        "histogram_quantile(0.99, sum by (job, le) (rate(commit_ms_bucket[5m]))) > 1e3",
        {"commit_ms_bucket"},
        {"job", "le"},
    ),
    # Keywords, a duration after offset, a number in hex: none of them is a metric.
    ("x_total unless x_total offset 15m > bool 0x1f", {"x_total"}, set()),
    (
        "a / on (job) group_left (instance, pod) b or vector(0)",
        {"a", "b"},
        {"job", "instance", "pod"},
    ),
    # Braces and keywords inside a string, a subquery range: not names.
    (
        "60 * sum(rate(foo_total{l=\"a.b{c} and by (x)\", m!~'y'}[1h:5m]))",
        {"foo_total"},
        {"l", "m"},
    ),
    ("sum(x) without (instance) - min(y) by (le)", {"x", "y"}, {"instance", "le"}),
    ("job:ductor_ticks:rate5m * 2", {"job:ductor_ticks:rate5m"}, set()),
    ('max_over_time(up{job="ductor"}[10m]) == 0', {"up"}, {"job"}),
]


@pytest.mark.parametrize(("expr", "metrics", "labels"), EXAMPLES)
def test_names_in_finds_metrics_and_labels_only(
    expr: str, metrics: set[str], labels: set[str]
) -> None:
    assert names_in(expr) == Names(frozenset(metrics), frozenset(labels))


EXPOSITION = """\
# HELP ductor_ticks_total ticks by outcome
# TYPE ductor_ticks_total counter
ductor_ticks_total{ductor_outcome="committed",otel_scope_name="ductor.processor"} 3.0
# HELP ductor_commit_duration_milliseconds time of the batched conditional UPDATE
# TYPE ductor_commit_duration_milliseconds histogram
ductor_commit_duration_milliseconds_bucket{le="5.0"} 1.0
ductor_commit_duration_milliseconds_bucket{le="+Inf"} 1.0
ductor_commit_duration_milliseconds_count 1.0
ductor_commit_duration_milliseconds_sum 2.5
"""


def test_problems_name_a_misspelt_metric_a_missing_label_and_a_legend_label() -> None:
    good = [
        Query("ok", 'sum by (ductor_outcome) (rate(ductor_ticks_total{job="d"}[5m]))'),
        Query(
            "quantile",
            "histogram_quantile(0.5,"
            " sum by (le) (rate(ductor_commit_duration_milliseconds_bucket[5m])))",
        ),
        Query("scrape", 'up{job="ductor"} == 0', frozenset({"instance"})),
    ]
    assert problems(good, EXPOSITION) == []
    bad = [
        Query("typo", "rate(ductor_tick_total[5m])"),
        Query("family", "rate(ductor_commit_duration_milliseconds[5m])"),  # no such sample
        Query("label", "sum by (ductor_reason) (ductor_ticks_total)"),
        Query("legend", "ductor_ticks_total", frozenset({"error_type"})),
        Query("constant", "vector(1)"),
    ]
    assert problems(bad, EXPOSITION) == [
        "typo: ductor_tick_total is not exported",
        "family: ductor_commit_duration_milliseconds is not exported",
        "label: no metric of it has the label ductor_reason",
        "legend: no metric of it has the label error_type",
        "constant: names no metric: vector(1)",
    ]


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def test_the_dashboard_is_importable_and_uses_the_datasource_variable() -> None:
    dashboard = load_dashboard()
    assert dashboard["schemaVersion"] >= 39
    assert dashboard["uid"] and dashboard["title"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert {"job", "instance"} <= variables.keys()
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in _panels(dashboard):
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
            # Every panel follows the job and instance pickers.
            assert '$job"' in target["expr"] and '$instance"' in target["expr"], panel["title"]


def test_conflicts_and_errors_are_on_separate_panels() -> None:
    """A conflict is an expected outcome, not a failure: no panel shows both."""
    for panel in _panels(load_dashboard()):
        named = set().union(*(names_in(t["expr"]).metrics for t in panel["targets"]))
        assert not {"ductor_conflicts_total", "ductor_errors_total"} <= named, panel["title"]


def test_the_dashboard_shows_what_an_operator_needs() -> None:
    named = set().union(*(names_in(q.expr).metrics for q in dashboard_queries(load_dashboard())))
    assert {
        "ductor_ticks_total",
        "ductor_conflicts_total",
        "ductor_errors_total",
        "ductor_requeues_total",
        "ductor_force_fails_total",
        "ductor_dead_letters_total",
        "ductor_quarantined_total",
        "ductor_consumer_lag",
        "ductor_commit_duration_milliseconds_bucket",
        "ductor_end_to_end_latency_milliseconds_bucket",
        "ductor_ready",
        "ductor_runs_started_total",
        "ductor_runs_ended_total",
        "ductor_worker_step_attempts_total",
        "ductor_worker_step_duration_milliseconds_bucket",
    } <= named


def test_the_runs_and_steps_are_shown_by_workflow_status_type_and_outcome() -> None:
    """The business rows: runs started and ended per workflow (ended also per status, and the
    failure ratio), step attempts per type and outcome, durations per type."""
    grouped: dict[str, set[str]] = {}
    for query in dashboard_queries(load_dashboard()):
        names = names_in(query.expr)
        for metric in names.metrics:
            grouped.setdefault(metric, set()).update(names.labels | query.result_labels)
    assert "ductor_workflow" in grouped["ductor_runs_started_total"]
    assert {"ductor_workflow", "ductor_status"} <= grouped["ductor_runs_ended_total"]
    assert {"ductor_step_type", "ductor_outcome"} <= grouped["ductor_worker_step_attempts_total"]
    assert "ductor_step_type" in grouped["ductor_worker_step_duration_milliseconds_bucket"]


def test_every_alert_has_a_duration_a_severity_a_summary_and_a_first_check() -> None:
    rules = [rule for group in load_rules()["groups"] for rule in group["rules"]]
    names = [rule["alert"] for rule in rules]
    assert len(names) == len(set(names))
    for rule in rules:
        assert rule.keys() == {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        assert rule["labels"]["severity"] in {"critical", "warning"}, rule["alert"]
        assert rule["annotations"]["summary"], rule["alert"]
        assert "First check" in rule["annotations"]["description"], rule["alert"]
    for query in rule_queries(load_rules()):
        assert names_in(query.expr).metrics, query.where
    # Conflicts are expected: no rule alerts on them.
    assert not any("ductor_conflicts_total" in rule["expr"] for rule in rules)
