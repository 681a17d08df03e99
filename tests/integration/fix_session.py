"""Plugin: what the run as a whole does with the integration tests once they are collected:
which run alone (the serial mark), and the builds they need started early."""

from __future__ import annotations

import pytest

from .background_builds import NEEDED_BY

# Tests that change what every test shares (the local Kafka or Postgres restarted, killed or
# frozen: the fixtures that can), that start a three-broker cluster, or that build the package
# or the examples: `make pytest` runs them alone, after the others ran two at a time.
_SERIAL_FIXTURES = {"local_infra", "cluster"}
_SERIAL_FILES = {
    "test_wheel.py",
    "test_examples.py",
    "test_chaos.py",
    "test_bench.py",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if fixtures & _SERIAL_FIXTURES or item.path.name in _SERIAL_FILES:
            item.add_marker(pytest.mark.serial)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Builds the tests need start as soon as the tests are known (background_builds.py)."""
    files = {item.path.name for item in session.items}
    for name, build in NEEDED_BY.items():
        if name in files:
            build.start()


def pytest_sessionfinish(session: pytest.Session) -> None:
    for build in NEEDED_BY.values():
        build.clean()
