"""What the Grafana dashboard and the Prometheus rules ask of the processor's /metrics: the
metric and label names in their PromQL, found without a PromQL parser (a handful of regular
expressions over expressions we write ourselves), and the check of those names against a real
exposition. Shared by tests/unit/test_dashboards.py and tests/integration/test_dashboards.py.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[1]
DASHBOARD = REPO / "infra" / "grafana" / "ductor-dashboard.json"
RULES = REPO / "infra" / "prometheus" / "ductor-alerts.yml"

# Series Prometheus makes itself for every target, and the labels it puts on every series it
# scrapes: an expression may name them although no /metrics serves them.
SERVER_SERIES: Mapping[str, frozenset[str]] = {"up": frozenset({"job", "instance"})}
TARGET_LABELS = frozenset({"job", "instance"})

_KEYWORDS = frozenset({"and", "or", "unless", "offset", "bool", "atan2", "inf", "nan"})
_STRING = re.compile(r""""(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`""")
_GRAFANA_VARIABLE = re.compile(r"\$\{[^}]*\}|\$\w+")
_MATCHERS = re.compile(r"\{([^}]*)\}")
_MATCHER_LABEL = re.compile(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)")
_RANGE = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
# An identifier that does not continue a number or a duration (`1e3`, `0x1f`, `15m`).
_IDENTIFIER = re.compile(r"(?<![\w.:])([A-Za-z_:][\w:]*)(\s*\()?")
_LABEL_VALUES = re.compile(r"^\s*label_values\((?:(.*),)?\s*([A-Za-z_]\w*)\s*\)\s*$", re.S)
_LEGEND_LABEL = re.compile(r"\{\{\s*([A-Za-z_]\w*)\s*\}\}")


@dataclass(frozen=True)
class Names:
    """The metric names and the label names one PromQL expression uses."""

    metrics: frozenset[str]
    labels: frozenset[str]


def without_grafana_variables(expr: str) -> str:
    """``$job``, ``${datasource}``, ``$__rate_interval`` made plain PromQL: variables stand in
    label values and ranges only, where any duration reads the same."""
    return _GRAFANA_VARIABLE.sub("5m", expr)


def names_in(expr: str) -> Names:
    """Metric names (identifiers that are not functions, keywords, numbers or durations) and
    label names (in ``{...}`` matchers and ``by``/``without``/``on``/``ignoring``/``group_*``
    lists) of a PromQL expression."""
    text = _STRING.sub('""', without_grafana_variables(expr))
    labels: set[str] = set()
    for block in _MATCHERS.findall(text):
        labels.update(_MATCHER_LABEL.findall(block))
    text = _MATCHERS.sub(" ", text)
    text = _RANGE.sub(" ", text)
    for group in _GROUPING.findall(text):
        labels.update(name.strip() for name in group.split(",") if name.strip())
    text = _GROUPING.sub(" ", text)
    metrics = {
        name
        for name, call in _IDENTIFIER.findall(text)
        if not call and name.lower() not in _KEYWORDS
    }
    return Names(frozenset(metrics), frozenset(labels))


@dataclass(frozen=True)
class Query:
    """One PromQL expression of the dashboard or the rules, with where it is and the label
    names it expects in its result (a legend's ``{{label}}``, a variable's label)."""

    where: str
    expr: str
    result_labels: frozenset[str] = frozenset()


def dashboard_queries(dashboard: Mapping[str, Any]) -> Iterator[Query]:
    """Every panel target's expression and every query variable's ``label_values(...)``."""
    for panel in _panels(dashboard.get("panels", [])):
        for target in panel.get("targets", []):
            legend = frozenset(_LEGEND_LABEL.findall(target.get("legendFormat", "")))
            where = f"panel {panel.get('title')!r} target {target.get('refId')}"
            yield Query(where, target["expr"], legend)
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") != "query":
            continue
        query = variable["query"]
        text = query["query"] if isinstance(query, dict) else query
        found = _LABEL_VALUES.match(text)
        assert found, f"variable {variable['name']!r}: not a label_values(...) query: {text}"
        metric_expr, label = found.groups()
        if metric_expr:
            yield Query(f"variable {variable['name']!r}", metric_expr, frozenset({label}))


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))  # those of a collapsed row


def rule_queries(rules: Mapping[str, Any]) -> Iterator[Query]:
    for group in rules["groups"]:
        for rule in group["rules"]:
            name = rule.get("alert") or rule.get("record")
            yield Query(f"rule {name!r}", rule["expr"])


def load_dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def load_rules() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(RULES.read_text())
    return loaded


def all_queries() -> list[Query]:
    return [*dashboard_queries(load_dashboard()), *rule_queries(load_rules())]


def exposed(exposition: str) -> dict[str, frozenset[str]]:
    """Each sample name of a Prometheus text exposition (``ductor_ticks_total``,
    ``..._bucket``) with the label names its samples carry."""
    labels: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            labels.setdefault(sample.name, set()).update(sample.labels)
    return {name: frozenset(found) for name, found in labels.items()}


def problems(queries: list[Query], *expositions: str) -> list[str]:
    """What the queries name that the expositions (a processor's, a worker's) do not serve: a
    metric that is not one of their sample names, a label that none of the expression's
    metrics carries."""
    served: dict[str, frozenset[str]] = dict(SERVER_SERIES)
    for exposition in expositions:
        for name, labels in exposed(exposition).items():
            served[name] = served.get(name, frozenset()) | labels
    found: list[str] = []
    for query in queries:
        names = names_in(query.expr)
        if not names.metrics:
            found.append(f"{query.where}: names no metric: {query.expr}")
        for metric in sorted(names.metrics - served.keys()):
            found.append(f"{query.where}: {metric} is not exported")
        carried = TARGET_LABELS.union(*(served.get(m, frozenset()) for m in names.metrics))
        for label in sorted((names.labels | query.result_labels) - carried):
            found.append(f"{query.where}: no metric of it has the label {label}")
    return found
