"""`ductor workflows register FILE` checks the document against schemas/workflow.schema.json
before parsing it, and refuses a wrong one with exit 2 and the place in it that is wrong;
`workflows register MODULE:ATTR` imports a workflow written in Python and refuses what is not
one, or not a valid one, the same way. Every case here is refused before anything connects, so
no service is needed."""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from processor.cli.common import EXIT_USAGE, CliError
from processor.cli.workflows import cmd_workflows_register
from processor.io.config.settings import Settings
from processor.io.shipped.workflow_schema import (
    WorkflowSchemaError,
    check_workflow_document,
    workflow_validator,
)

SAMPLE_PATH = Path(__file__).resolve().parents[2] / "schemas" / "workflows" / "sample.json"
SAMPLE: dict[str, Any] = json.loads(SAMPLE_PATH.read_text())


def _sample(edit: dict[str, Any]) -> dict[str, Any]:
    raw = copy.deepcopy(SAMPLE)
    raw.update(edit)
    return raw


def _register(tmp_path: Path, document: Any) -> CliError:
    path = tmp_path / "wf.json"
    path.write_text(json.dumps(document))
    with pytest.raises(CliError) as info:
        cmd_workflows_register(Settings(), argparse.Namespace(source=str(path)))
    assert info.value.code == EXIT_USAGE
    assert str(info.value).startswith(f"{path}: ")
    return info.value


def test_the_sample_matches_the_schema() -> None:
    check_workflow_document(SAMPLE)
    assert workflow_validator() is workflow_validator()  # read once, cached


@pytest.mark.parametrize(
    ("document", "where", "what"),
    [
        ({"name": "x", "version": 1}, "at $:", "'steps' is a required property"),
        (_sample({"version": "1"}), "at $.version:", "is not of type 'integer'"),
        (_sample({"owner": "me"}), "at $:", "'owner' was unexpected"),
        (_sample({"steps": []}), "at $.steps:", "should be non-empty"),
        (
            _sample({"steps": [{"name": "a", "type": "t", "timeout_ms": 0}]}),
            "at $.steps[0].timeout_ms:",
            "0 is less than the minimum of 1",
        ),
        (
            _sample({"steps": [{"name": "a", "type": "t", "retry": {"jitter": 1}}]}),
            "at $.steps[0].retry:",
            "'jitter' was unexpected",
        ),
        ([1, 2], "at $:", "is not of type 'object'"),
    ],
)
def test_a_document_off_the_schema_is_refused_naming_the_place(
    tmp_path: Path, document: Any, where: str, what: str
) -> None:
    with pytest.raises(WorkflowSchemaError) as info:
        check_workflow_document(document)
    assert where in str(info.value) and what in str(info.value)
    message = str(_register(tmp_path, document))
    assert "does not match schemas/workflow.schema.json " + where in message
    assert what in message
    assert "\n" not in message


def test_a_huge_offending_value_is_not_quoted_whole() -> None:
    with pytest.raises(WorkflowSchemaError) as info:
        check_workflow_document(_sample({"steps": {"x" * 10_000: 1}}))
    assert len(str(info.value)) < 300


def test_what_the_schema_cannot_say_is_still_refused_by_parse_workflow(tmp_path: Path) -> None:
    cyclic = _sample(
        {
            "steps": [
                {"name": "a", "type": "t", "depends_on": ["b"]},
                {"name": "b", "type": "t", "depends_on": ["a"]},
            ]
        }
    )
    check_workflow_document(cyclic)
    assert "dependency cycle among ['a', 'b']" in str(_register(tmp_path, cyclic))


def test_the_command_exits_2_with_one_sentence(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(_sample({"version": 0})))
    env = {**os.environ, "DUCTOR_PG_DSN": "postgresql://nobody@127.0.0.1:1/none"}
    done = subprocess.run(
        [sys.executable, "-m", "processor", "workflows", "register", str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == (
        f"ductor: {path}: does not match schemas/workflow.schema.json at $.version:"
        " 0 is less than the minimum of 1\n"
    )


def _register_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str, spec: str) -> str:
    (tmp_path / "user_flows.py").write_text(source)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "user_flows", raising=False)
    with pytest.raises(CliError) as info:
        cmd_workflows_register(Settings(), argparse.Namespace(source=spec))
    assert info.value.code == EXIT_USAGE
    return str(info.value)


CODE = """
from processor import Workflow
good = Workflow("good")
good.step(name="a", type="a")(lambda ctx: None)
cyclic = Workflow("cyclic")
cyclic.step(name="a", type="a", after=["b"])(lambda ctx: None)
cyclic.step(name="b", type="b", after=["a"])(lambda ctx: None)
settings = {"not": "a workflow"}
several = [good, settings]
none = []
"""


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("user_flows:cyclic", "user_flows:cyclic: workflow.steps: dependency cycle among"),
        ("user_flows:settings", "user_flows:settings holds a dict, not a Workflow"),
        ("user_flows:several", "user_flows:several holds a dict, not a Workflow"),
        ("user_flows:none", "user_flows:none is an empty list"),
        ("user_flows:missing", "module 'user_flows' has no attribute 'missing'"),
        ("not_there:flow", "cannot import module 'not_there': ModuleNotFoundError"),
        ("user_flows:good:x", "workflows register 'user_flows:good:x' is not MODULE:ATTR"),
    ],
)
def test_a_workflow_in_code_that_cannot_be_registered_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spec: str, message: str
) -> None:
    assert message in _register_code(tmp_path, monkeypatch, CODE, spec)
