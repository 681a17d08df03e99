"""The Prometheus alerting rules checked by promtool (Debian's prometheus package; `make tools`
installs it): the rules file is valid, and its unit tests (infra/prometheus/ductor-alerts.test.yml)
pass and cover every alert, each with a time it fires and one where it must not. promtool
missing fails these tests rather than skipping them: CI must run them."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.markdown import REPO, anchors, headings, slug
from tests.promql import RULES, load_rules

RULE_TESTS = RULES.with_name("ductor-alerts.test.yml")
PROMETHEUS_CONFIG = RULES.with_name("prometheus.yml")


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed: run `make tools` (apt-get install prometheus)")
    return subprocess.run(
        [promtool, *args],
        cwd=RULES.parent,  # the tests name the rules file relative to themselves
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_promtool_finds_the_rules_valid() -> None:
    done = _promtool("check", "rules", RULES.name)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_rules_unit_tests_pass() -> None:
    done = _promtool("test", "rules", RULE_TESTS.name)
    assert done.returncode == 0, done.stdout + done.stderr


def _cases(path: Path) -> list[dict[str, Any]]:
    loaded: dict[str, Any] = yaml.safe_load(path.read_text())
    assert loaded["rule_files"] == [RULES.name]
    return [case for test in loaded["tests"] for case in test.get("alert_rule_test", [])]


def test_every_alert_is_tested_where_it_fires_and_where_it_must_not() -> None:
    alerts = {rule["alert"] for group in load_rules()["groups"] for rule in group["rules"]}
    cases = _cases(RULE_TESTS)
    fires = {case["alertname"] for case in cases if case.get("exp_alerts")}
    quiet = {case["alertname"] for case in cases if not case.get("exp_alerts")}
    assert alerts - fires == set(), "alerts with no test where they fire"
    assert alerts - quiet == set(), "alerts with no test where they must not fire"
    assert (fires | quiet) - alerts == set(), "tests of alerts that do not exist"


ALERTS_PAGE = REPO / "docs" / "operations" / "alerts.md"
RUNBOOKS = "docs/operations/alerts.md#"


def test_every_alert_has_a_runbook_in_the_operations_guide() -> None:
    """Each rule's runbook_url is a section of docs/operations/alerts.md named after the alert:
    where its alert lands a person on call, to read what it means and what to do."""
    text = ALERTS_PAGE.read_text()
    in_section = {slug(h.text): h.text for h in headings(text) if h.level > 1}
    assert anchors(text) >= in_section.keys()
    for group in load_rules()["groups"]:
        for rule in group["rules"]:
            url = rule["annotations"].get("runbook_url", "")
            assert url.startswith(RUNBOOKS), f"{rule['alert']}: runbook_url {url!r}"
            anchor = url.removeprefix(RUNBOOKS)
            assert in_section.get(anchor) == rule["alert"], (
                f"{rule['alert']}: no section `{rule['alert']}` under Alerts for #{anchor}"
            )


def test_an_absent_rule_fires_when_a_scraped_job_exports_nothing() -> None:
    """The rules that watch instances need a series to fire: with no processor or worker
    scraped at all, only absent() sees it. Every job the example configuration scrapes is
    watched by one."""
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    jobs = {c["job_name"] for c in config["scrape_configs"]}
    watched = {
        job
        for group in load_rules()["groups"]
        for rule in group["rules"]
        for job in re.findall(r'absent\(\s*\w+\{job="([^"]+)"\}\s*\)', rule["expr"])
    }
    assert watched == jobs
