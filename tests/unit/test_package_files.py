"""The files the package ships (processor/io/shipped/files.py) are the top-level schemas/
folder's: every one of them is read from inside the package, and every one is in the
package data that goes into the wheel."""

from __future__ import annotations

import fnmatch
import json
import tomllib
from pathlib import Path

import pytest

from processor.io.postgres.migrate import pending_migrations
from processor.io.shipped import files as package_files
from processor.io.shipped.files import Migration

REPO = Path(__file__).resolve().parents[2]
SCHEMAS = REPO / "schemas"


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(root)): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts
    }


def test_the_package_reads_the_top_level_schemas_folder_through_a_link() -> None:
    link = REPO / "processor" / "schemas"
    assert link.is_symlink()
    assert link.resolve() == SCHEMAS.resolve()
    packaged = Path(str(package_files.schemas()))
    assert _files(packaged) == _files(SCHEMAS)


def test_the_migrations_are_every_sql_file_in_order() -> None:
    shipped = package_files.migrations()
    paths = sorted((SCHEMAS / "migrations").glob("*.sql"))
    assert [m.name for m in shipped] == [p.stem for p in paths]
    assert [m.sql for m in shipped] == [p.read_text() for p in paths]
    assert shipped[0].name == "0001_init"


def test_the_schemas_and_the_sample_workflow() -> None:
    for name in ("workflow.schema.json", "wakeup.schema.json", "request.schema.json"):
        assert package_files.json_schema(name) == json.loads((SCHEMAS / name).read_text())
    sample = json.loads((SCHEMAS / "workflows" / "sample.json").read_text())
    assert package_files.sample_workflow() == sample


def test_a_missing_file_is_one_sentence_naming_it() -> None:
    with pytest.raises(package_files.PackageFileMissing) as caught:
        package_files.sample_workflow("no-such-workflow")
    message = str(caught.value)
    assert message.startswith("the package's schemas/workflows/no-such-workflow.json is missing")
    assert message.endswith(": reinstall ductor-processor")


def _glob_matches(name: str, pattern: str) -> bool:
    """Whether setuptools' package-data glob ``pattern`` names ``name`` (``*`` stays within
    one folder, as in glob, unlike fnmatch alone)."""
    parts, wanted = name.split("/"), pattern.split("/")
    return len(parts) == len(wanted) and all(map(fnmatch.fnmatchcase, parts, wanted))


def test_every_schemas_file_is_package_data() -> None:
    """A file added to schemas/ that no package-data pattern names would be missing from the
    wheel (the wheel test in tests/integration/test_wheel.py sees the built wheel itself)."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["processor"]
    unshipped = [
        name
        for name in _files(SCHEMAS)
        if not any(_glob_matches(f"schemas/{name}", pattern) for pattern in patterns)
    ]
    assert unshipped == []
    assert not _glob_matches("schemas/workflows/sample.json", "schemas/*.json")


def test_pending_migrations_are_those_not_applied_in_order() -> None:
    available = [Migration("0001_a", "SELECT 1"), Migration("0002_b", "SELECT 2")]
    assert pending_migrations(available, {"0001_a"}) == [available[1]]
    assert pending_migrations(available, set()) == available
    assert pending_migrations(available, {"0001_a", "0002_b"}) == []
