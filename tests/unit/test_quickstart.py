"""The README's quickstart (tests/quickstart.py reads it), checked without services: at most 60
lines, right after the title and one paragraph; the README's first command runs the demo and
its second passes the tests; the commands are ones the Makefile and the `ductor` CLI take; the
wheel it installs is this version's; the code it shows is the example's own; the output it
promises is what the example's steps give for the input it starts. tests/integration/
test_wheel.py runs the same commands from the installed wheel and compares that output."""

from __future__ import annotations

import importlib.util
import json
import re
import tomllib
from typing import Any

import orjson
import pytest

from processor.cli.main import parse_args
from processor.core.workflow import parse_workflow
from processor.worker import StepContext, StepRegistry
from tests.markdown import REPO, fences, headings
from tests.quickstart import MAX_LINES, README, TITLE, commands, quickstart

QUICKSTART = quickstart()
SESSION = QUICKSTART.install + QUICKSTART.rest
EXAMPLE = REPO / "examples" / "orders"
# The make targets the session uses, and the command of each in the Makefile: the wheel test
# runs the first itself (`python -m build`, with the output in its own folder); the second is
# what its services are.
MAKE_RECIPES = {
    "wheel": "$(BUILD_VENV)/bin/python -m build --outdir dist . >$(BUILD_LOG) 2>&1 \\",
    "up": "$(PY) infra/local.py up",
}


def _recipe(target: str) -> list[str]:
    makefile = (REPO / "Makefile").read_text()
    match = re.search(rf"^{target}:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    assert match is not None, f"the Makefile has no target {target}"
    return [line.strip() for line in match[1].splitlines()]


def test_the_quickstart_comes_right_after_the_title_and_one_paragraph() -> None:
    text = README.read_text()
    title, second = headings(text)[:2]
    assert (title.level, second.level, second.text) == (1, 2, TITLE)
    between = text.splitlines()[title.line : second.line - 1]
    paragraphs = "\n".join(between).strip().split("\n\n")
    assert len(paragraphs) == 1, "one paragraph of what Ductor is, then the quickstart"
    assert QUICKSTART.line == second.line


def test_the_quickstart_is_at_most_60_lines() -> None:
    assert QUICKSTART.length <= MAX_LINES


def test_the_readme_s_first_command_runs_the_demo_and_its_second_passes_the_tests() -> None:
    first = fences(README.read_text())[0]
    assert first.info == "sh"
    two = commands(first.body, first.line + 1)
    assert [c.argv for c in two] == [("make", "demo"), ("make", "test")]
    assert QUICKSTART.checkout == tuple(two)
    assert _recipe("demo") == ["$(VENV)/bin/ductor demo"]
    assert (REPO / ".ci" / "run").read_text().rstrip().endswith("\nmake test")


def test_every_shell_block_of_the_quickstart_is_run_by_the_wheel_test() -> None:
    """The checkout's block, then the session's: its first block (the wheel test's fixture runs
    it) and every block after it (its orders test runs them all, in order)."""
    assert len(QUICKSTART.blocks) >= 3
    assert tuple(c for block in QUICKSTART.blocks[1:] for c in block) == SESSION
    wheel_test = (REPO / "tests" / "integration" / "test_wheel.py").read_text()
    assert "QUICKSTART.install" in wheel_test and "QUICKSTART.rest" in wheel_test


def test_the_make_targets_of_the_session_are_the_two_the_wheel_test_stands_in_for() -> None:
    targets = [c.argv[1:] for c in SESSION if c.argv[0] == "make"]
    assert targets == [("wheel",), ("up",)]
    for (target,) in targets:
        assert MAKE_RECIPES[target] in [line.removeprefix("@") for line in _recipe(target)]


def test_the_session_installs_this_version_s_wheel_into_the_virtualenv_it_activates() -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    argvs = [c.argv for c in QUICKSTART.install]
    assert argvs[0] == ("make", "wheel")
    assert argvs[1][:3] == ("python3", "-m", "venv")
    assert argvs[2] == (".", f"{argvs[1][3]}/bin/activate")
    # The wheel dist/ holds, whatever its platform tag (compiled for this machine's CPython,
    # or pure Python where no compiler was found), with its dependencies from the index.
    assert argvs[3] == (
        "pip",
        "install",
        "--find-links",
        "dist",
        f"ductor-processor[binary]=={version}",
    )
    assert not any(c.background for c in QUICKSTART.install)


def test_every_ductor_command_of_the_session_is_one_the_cli_takes() -> None:
    ductor = [c for c in SESSION if c.argv[0] == "ductor"]
    assert [c.argv[1] for c in ductor] == [
        "migrate",
        "topics",
        "workflows",
        "process",
        "worker",
        "start",
    ]
    for command in ductor:
        parse_args(list(command.argv[1:]))  # exits 2 on bad usage
    assert [c.argv[1] for c in ductor if c.background] == ["process", "worker"]
    (worker,) = [c for c in ductor if c.argv[1] == "worker"]
    assert parse_args(list(worker.argv[1:])).app == "steps:registry"


def test_the_session_runs_the_example_from_its_folder() -> None:
    cds = [c.argv for c in SESSION if c.argv[0] == "cd"]
    assert cds == [("cd", "examples/orders")]
    (register,) = [c for c in SESSION if c.argv[1:3] == ("workflows", "register")]
    assert (EXAMPLE / register.argv[3]).is_file()


def test_the_code_shown_is_an_excerpt_of_the_example_s_steps() -> None:
    """Each run of lines between two `...` is, as written, a run of lines of steps.py."""
    source = (EXAMPLE / "steps.py").read_text()
    pieces = [p.strip("\n") for p in re.split(r"^[ \t]*\.\.\.\n", QUICKSTART.steps, flags=re.M)]
    position = 0
    for piece in [p for p in pieces if p.strip()]:
        found = source.find(piece + "\n", position)
        assert found >= 0, f"not in examples/orders/steps.py as written:\n{piece}"
        position = found + len(piece)


def _steps() -> StepRegistry:
    spec = importlib.util.spec_from_file_location("quickstart_orders", EXAMPLE / "steps.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    registry: StepRegistry = module.registry
    return registry


def _jsonb(value: Any) -> Any:
    """As Postgres's jsonb gives it back: an object's keys shortest first, then by bytes."""
    if isinstance(value, dict):
        ordered = sorted(value, key=lambda k: (len(k.encode()), k.encode()))
        return {k: _jsonb(value[k]) for k in ordered}
    if isinstance(value, list):
        return [_jsonb(v) for v in value]
    return value


def test_the_output_shown_is_what_the_example_gives_for_the_input_started() -> None:
    (start,) = [c.argv for c in SESSION if c.argv[1:2] == ("start",)]
    assert SESSION[-1].argv == start, "the output shown is the last command's"
    assert "--wait" in start, "the run's output is shown once it ended"
    run_id = start[start.index("--run-id") + 1]
    run_input = json.loads(start[start.index("--input") + 1])
    wf = parse_workflow(json.loads((EXAMPLE / "workflow.json").read_text()))
    assert wf.name == start[2]
    registry, outputs = _steps(), dict[str, Any]()
    for step in wf.steps:  # listed after their dependencies
        fn = registry.get(step.step_type)
        assert fn is not None and set(step.depends_on) <= set(outputs)
        deps = {name: outputs[name] for name in step.depends_on}
        outputs[step.name] = fn(StepContext(run_id, step.name, 1, 0, run_input, deps))
    assert wf.output is not None
    declared = {name: outputs[step] for name, step in wf.output.fields}
    assert QUICKSTART.output == orjson.dumps(_jsonb(declared)).decode() + "\n"


@pytest.mark.parametrize(
    ("block", "problem"),
    [
        ("ductor a | grep b\n", "more shell"),
        ("ductor a; ductor b\n", "more shell"),
        ("ductor a & ductor b\n", "only ends a line"),
        ("ductor start x --input '{\n", "never closed"),
    ],
)
def test_a_block_the_session_cannot_run_as_written_is_refused(block: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        commands(block, 1)


def test_a_block_s_commands_are_its_lines_split_at_and_and_ampersand() -> None:
    block = "a 1 && b '2\n  3'   # a comment\nc &\n"
    assert [(c.argv, c.background, c.line) for c in commands(block, 10)] == [
        (("a", "1"), False, 10),
        (("b", "2\n  3"), False, 10),
        (("c",), True, 12),
    ]


def test_the_quickstart_shows_the_page_with_its_command_address_and_picture() -> None:
    """The page is not in a block the wheel test runs (`ductor ui` serves until stopped): the
    prose after the output names the extra's install, the command, the run's address at the
    command's default host and port, and the picture of a run's page the docs show."""
    text = README.read_text().splitlines()
    body = "\n".join(text[QUICKSTART.line - 1 : QUICKSTART.line - 1 + QUICKSTART.length])
    after = body[body.index(QUICKSTART.output) + len(QUICKSTART.output) :]
    assert not any(c.argv[:2] == ("ductor", "ui") for c in SESSION)
    ui = parse_args(["ui"])
    run_id = next(c.argv for c in SESSION if c.argv[1:2] == ("start",))[4]
    assert f"`http://{ui.host}:{ui.port}/runs/{run_id}`" in after
    assert "`ductor ui &`" in after and "'ductor-processor[ui]==" in after
    assert "(docs/images/ui-run-timeline.png)" in after
    assert (REPO / "docs" / "images" / "ui-run-timeline.png").is_file()
