"""The Python a workflow was registered from, against the real Postgres and a real `ductor ui`
in headless Chromium: `ductor workflows register MODULE:ATTR` keeps the text of the module that
created the workflow (bounded at 64 KiB, cut with a line that says so); `ductor workflows show
--source` prints it (as text, and with its module and when it was kept as JSON), and the
version's page shows it with its module, as text: markup in it (``</pre><script>``) never runs.
A version registered from JSON has none: the command exits 1 and the page says so. The same
version registered again from code replaces the text (the definition is unchanged); again from
JSON, it stays.

Screenshots of the two pages go to the test's artefacts (fix_browser.py's ``shots``)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest
from selenium.webdriver.remote.webdriver import WebDriver

from processor.core.workflow_source import MAX_SOURCE_BYTES, bounded_source
from processor.io.config.settings import Settings

from .browser import Page, start_ui
from .children import Spawned, run_ductor

pytestmark = pytest.mark.integration

HOSTILE = "</pre><script>document.title = 'owned'</script><b>bold</b>"


def _module(name: str, note: str) -> str:
    """A code-first workflow's module: two steps, markup in a string and in a comment, and
    enough comment lines after them to pass the bound."""
    head = f'''"""{note}"""
from processor import StepContext, Workflow

# {HOSTILE}
flow = Workflow("{name}", version=1, output="confirm")


@flow.step
def charge(ctx: StepContext) -> dict[str, str]:
    return {{"note": "{HOSTILE}"}}


@flow.step(after=[charge])
def confirm(ctx: StepContext) -> dict[str, str]:
    return ctx.deps["charge"]
'''
    padding = "".join(f"# padding line {i:05d} {'.' * 60}\n" for i in range(1200))
    return head + padding


def _show_source(settings: Settings, name: str) -> tuple[int, Any, str]:
    shown = run_ductor(settings, "-o", "json", "workflows", "show", name, "--source")
    return shown.returncode, orjson.loads(shown.stdout), shown.stderr


def test_a_workflow_registered_from_code_keeps_its_module_shown_by_the_cli_and_the_page(
    settings: Settings,
    pg: psycopg.Connection[Any],
    spawn: Callable[..., Spawned],
    browser: WebDriver,
    shots: Path,
    tmp_path: Path,
) -> None:
    t = uuid.uuid4().hex[:8]
    name, module = f"wfsrc-{t}", f"wfsrc_flows_{t}"
    text = _module(name, "first")
    assert len(text.encode()) > MAX_SOURCE_BYTES
    (tmp_path / f"{module}.py").write_text(text)

    registered = run_ductor(settings, "workflows", "register", f"{module}:flow", cwd=tmp_path)
    assert registered.returncode == 0, registered.stderr
    assert registered.stdout == f"workflow {name} v1 registered\n"

    # -- the CLI: JSON, then the text itself -----------------------------------------------------
    code, document, _ = _show_source(settings, name)
    assert code == 0
    assert (document["name"], document["version"]) == (name, 1)
    kept = document["source"]
    assert kept["module"] == module
    assert kept["text"] == bounded_source(text)
    assert kept["text"].startswith('"""first"""\n') and HOSTILE in kept["text"]
    last = kept["text"].splitlines()[-1]
    assert last.startswith(f"# ... cut: the module is {len(text.encode())} bytes; its first ")
    first_kept_at = kept["kept_at"]
    plain = run_ductor(settings, "workflows", "show", name, "--source")
    assert (plain.returncode, plain.stdout) == (0, kept["text"])
    definition = run_ductor(settings, "-o", "json", "workflows", "show", name)  # unchanged
    assert orjson.loads(definition.stdout)["steps"][0]["name"] == "charge"

    # -- from JSON: none, and exit 1 -------------------------------------------------------------
    as_json = tmp_path / "from-json.json"
    as_json.write_text(
        orjson.dumps(
            {"name": f"{name}-json", "version": 1, "steps": [{"name": "a", "type": "a"}]}
        ).decode()
    )
    assert run_ductor(settings, "workflows", "register", str(as_json)).returncode == 0
    code, document, stderr = _show_source(settings, f"{name}-json")
    assert (code, document["source"]) == (1, None)
    assert "was registered from JSON: no Python source is kept" in stderr
    assert run_ductor(settings, "workflows", "show", f"{name}-json", "--source").returncode == 1

    # -- the page --------------------------------------------------------------------------------
    port = start_ui(spawn, settings, "", "ui")
    page = Page(browser, port, shots)
    page.open(f"/workflows/{name}/1")
    assert page.text("#source-module").startswith(f"registered from Python: module {module}")
    shown = page.text("pre#source")
    assert shown.startswith('"""first"""') and HOSTILE in shown  # as text
    assert "# ... cut: the module is" in shown.splitlines()[-1]
    assert not page.has("main script") and not page.has("main b")
    assert browser.title != "owned"
    page.screenshot("workflow-from-code.png")
    page.open(f"/workflows/{name}-json/1")
    assert page.text("#source-module").startswith("registered from JSON")
    assert not page.has("pre#source")
    page.screenshot("workflow-from-json.png")

    # -- registered again: from code, the text is replaced; from JSON, it stays ------------------
    (tmp_path / f"{module}.py").write_text(_module(name, "second"))
    again = run_ductor(settings, "workflows", "register", f"{module}:flow", cwd=tmp_path)
    assert again.stdout == f"workflow {name} v1 already registered\n", again.stderr
    _, document, _ = _show_source(settings, name)
    assert document["source"]["text"].startswith('"""second"""\n')
    assert document["source"]["kept_at"] > first_kept_at
    exported = tmp_path / "same.json"
    exported.write_bytes(run_ductor(settings, "workflows", "show", name).stdout.encode())
    same = run_ductor(settings, "workflows", "register", str(exported))
    assert same.stdout == f"workflow {name} v1 already registered\n", same.stderr
    _, document, _ = _show_source(settings, name)
    assert document["source"]["text"].startswith('"""second"""\n')
    row = pg.execute(
        "SELECT source_module FROM eec_workflow_definition WHERE name = %s", (name,)
    ).fetchone()
    assert row == (module,)
