"""Write infra/k8s/prometheus-rule.yaml, the Prometheus Operator's PrometheusRule, from the
alerting rules in infra/prometheus/ductor-alerts.yml (the one place they are edited).

    .venv/bin/python infra/prometheus_rule.py           # (re)write the PrometheusRule
    .venv/bin/python infra/prometheus_rule.py --check   # exit 1 if it is not up to date

The rules file's ``groups:`` section is copied as text, indented under ``spec:``, so the
rules keep their layout and comments; tests/unit/test_k8s_manifests.py checks that both files
hold the same groups.
"""

from __future__ import annotations

import sys
from pathlib import Path

INFRA = Path(__file__).resolve().parent
RULES = INFRA / "prometheus" / "ductor-alerts.yml"
PROMETHEUS_RULE = INFRA / "k8s" / "prometheus-rule.yaml"

_HEADER = """\
# GENERATED from infra/prometheus/ductor-alerts.yml by infra/prometheus_rule.py: edit the
# rules there, then run `make k8s-rules`. docs/operations/alerts.md says what each alert
# means. Your Prometheus must select this rule (its ruleSelector, e.g. a `release: <name>`
# label with kube-prometheus-stack): add that label in an overlay.
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: ductor
  labels:
    app.kubernetes.io/name: ductor
    app.kubernetes.io/part-of: ductor
spec:
"""


def render(rules_text: str) -> str:
    """The PrometheusRule for a rules file's text: its ``groups:`` section under ``spec:``."""
    lines = rules_text.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.startswith("groups:"))
    except StopIteration:
        raise ValueError("the rules file has no top-level 'groups:' key") from None
    body = [f"  {line}" if line.strip() else "" for line in lines[start:]]
    return _HEADER + "\n".join(body).rstrip() + "\n"


def main(argv: list[str]) -> int:
    wanted = render(RULES.read_text())
    if argv == ["--check"]:
        if PROMETHEUS_RULE.read_text() != wanted:
            print(f"{PROMETHEUS_RULE} is out of date: run `make k8s-rules`", file=sys.stderr)
            return 1
        return 0
    if argv:
        print(__doc__, file=sys.stderr)
        return 2
    PROMETHEUS_RULE.write_text(wanted)
    print(f"wrote {PROMETHEUS_RULE.relative_to(INFRA.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
