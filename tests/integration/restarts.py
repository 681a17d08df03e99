"""Restart or crash the local Kafka and Postgres on their data, for outage tests: the
``LocalInfra`` of processor/tools/local_infra.py (shared with the chaos run), or a skipped
test when the test's services are not the ones infra/local.py runs here."""

from __future__ import annotations

import pytest

from processor.io.config.settings import Settings
from processor.tools.local_infra import LocalInfra, NotLocalServices, local_services

__all__ = ["LocalInfra", "local_infra_for"]


def local_infra_for(settings: Settings) -> LocalInfra:
    """The services infra/local.py runs, if they are the ones ``settings`` use; else skip."""
    try:
        return local_services(settings)
    except NotLocalServices as exc:
        pytest.skip(str(exc))
