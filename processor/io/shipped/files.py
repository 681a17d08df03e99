"""The files the package ships beside its code, read with ``importlib.resources``: the SQL
migrations, the JSON schemas and the sample workflows.

Their source is the repository's top-level ``schemas/`` folder. ``processor/schemas`` is a
symbolic link to it, so that a checkout, an editable install and the wheel read them by the
same path inside the package: building the wheel copies the files behind the link
(``[tool.setuptools.package-data]`` in pyproject.toml). Nothing reads them relative to the
repository, which an installed package does not have.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any

SCHEMAS = "schemas"
MIGRATIONS = "migrations"
WORKFLOWS = "workflows"


class PackageFileMissing(RuntimeError):
    """A file the package ships is not there: the installation is incomplete."""


@dataclass(frozen=True)
class Migration:
    """One SQL migration: its name (the file name without ``.sql``, as recorded in the
    database) and its statements."""

    name: str
    sql: str


def schemas() -> Traversable:
    """The package's ``schemas`` folder."""
    return resources.files("processor").joinpath(SCHEMAS)


def _shipped(*parts: str) -> Traversable:
    """``schemas/<parts>`` of the package; PackageFileMissing when it is not there."""
    item = schemas().joinpath(*parts)
    if not (item.is_dir() or item.is_file()):
        where = "/".join((SCHEMAS, *parts))
        raise PackageFileMissing(
            f"the package's {where} is missing ({item}): reinstall ductor-processor"
        )
    return item


def migrations() -> list[Migration]:
    """Every migration the package ships, in the order they apply (by file name)."""
    files = sorted(
        (f for f in _shipped(MIGRATIONS).iterdir() if f.is_file() and f.name.endswith(".sql")),
        key=lambda f: f.name,
    )
    return [Migration(f.name.removesuffix(".sql"), f.read_text(encoding="utf-8")) for f in files]


def json_schema(name: str) -> Any:
    """A JSON schema the package ships (``workflow.schema.json``, ``wakeup.schema.json``)."""
    return json.loads(_shipped(name).read_text(encoding="utf-8"))


def sample_workflow(name: str = "sample") -> Any:
    """A sample workflow definition the package ships, as its JSON document."""
    return json.loads(_shipped(WORKFLOWS, f"{name}.json").read_text(encoding="utf-8"))
