"""What a registration from Python keeps of the code (processor/authoring.py,
processor/io/runtime/module_source.py, core/workflow_source.py): the module that created the
``Workflow`` (not the one that imports it or lists it), its text whole while it fits 64 KiB,
else its first whole lines and a last one saying it was cut, never more than the bound (a
property over any text), and nothing a Postgres text column refuses. A workflow whose module
has no file has no source."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from processor import Workflow
from processor.core.workflow_source import MAX_SOURCE_BYTES, bounded_source, cut_mark
from processor.io.runtime.module_source import module_source

FLOWS = '''"""Orders, written in Python."""
from processor import StepContext, Workflow

orders = Workflow("orders", version=3)


@orders.step
def charge(ctx: StepContext) -> dict:
    return {"charged": "</pre><script>document.title = 'owned'</script>"}
'''
# A module that only gathers workflows written elsewhere: theirs is the source, not its own.
LISTING = """from wfsrc_flows import orders

every = [orders]
"""


@pytest.fixture
def modules(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "wfsrc_flows.py").write_text(FLOWS)
    (tmp_path / "wfsrc_listing.py").write_text(LISTING)
    sys.path.insert(0, str(tmp_path))
    try:
        yield tmp_path
    finally:
        sys.path.remove(str(tmp_path))
        for name in ("wfsrc_flows", "wfsrc_listing"):
            sys.modules.pop(name, None)


def test_the_source_is_the_text_of_the_module_that_created_the_workflow(modules: Path) -> None:
    listing = importlib.import_module("wfsrc_listing")
    (orders,) = listing.every
    assert orders.defined_in == "wfsrc_flows"
    source = module_source(orders.defined_in)
    assert source is not None
    assert (source.module, source.text) == ("wfsrc_flows", FLOWS)


def test_a_workflow_created_here_names_this_module() -> None:
    wf = Workflow("local")
    assert wf.defined_in == __name__
    source = module_source(wf.defined_in)
    assert source is not None and source.text == Path(__file__).read_text()


def test_a_workflow_whose_module_has_no_file_has_no_source() -> None:
    scope: dict[str, object] = {"__name__": "wfsrc_nowhere", "Workflow": Workflow}
    exec("wf = Workflow('typed-in')", scope)
    wf = scope["wf"]
    assert isinstance(wf, Workflow) and wf.defined_in == "wfsrc_nowhere"
    assert module_source(wf.defined_in) is None


def test_a_module_over_the_bound_keeps_its_first_whole_lines_and_says_it_was_cut() -> None:
    lines = [f"step_{i} = {'x' * 60!r}  # é\n" for i in range(2000)]
    text = "".join(lines)
    total = len(text.encode())
    assert total > MAX_SOURCE_BYTES
    kept = bounded_source(text)
    assert len(kept.encode()) <= MAX_SOURCE_BYTES
    body, mark = kept[: kept.rindex("# ... cut")], kept[kept.rindex("# ... cut") :]
    assert text.startswith(body) and body.endswith("\n")
    assert mark == cut_mark(total, len(body.encode()))
    assert (
        mark
        == f"# ... cut: the module is {total} bytes; its first {len(body.encode())} are shown\n"
    )
    assert len(body.encode()) > MAX_SOURCE_BYTES - 200  # nearly all the room is used


def test_a_module_within_the_bound_is_kept_whole() -> None:
    text = "a = 1\n" * (MAX_SOURCE_BYTES // 6)
    assert len(text.encode()) <= MAX_SOURCE_BYTES
    assert bounded_source(text) == text


def test_one_line_longer_than_the_bound_is_cut_on_a_character() -> None:
    text = "s = '" + "é" * MAX_SOURCE_BYTES + "'"
    kept = bounded_source(text)
    assert len(kept.encode()) <= MAX_SOURCE_BYTES
    assert kept.startswith("s = 'ééé") and "# ... cut: the module is" in kept


def test_what_postgres_cannot_store_is_written_as_its_escape() -> None:
    assert bounded_source("a = '\x00'\n") == "a = '\\x00'\n"
    assert bounded_source("b = '\udcff é'\n") == "b = '\\udcff é'\n"


@given(st.text(max_size=800), st.integers(min_value=120, max_value=600))
def test_never_more_than_the_bound_and_whole_when_it_fits(text: str, bound: int) -> None:
    kept = bounded_source(text, bound)
    size = len(kept.encode("utf-8"))  # storable: encodes without an error handler
    assert size <= bound
    assert "\x00" not in kept
    plain = text.encode("utf-8", "surrogatepass")
    storable = "\x00" not in text and plain == text.encode("utf-8", "backslashreplace")
    if storable and len(plain) <= bound:
        assert kept == text
