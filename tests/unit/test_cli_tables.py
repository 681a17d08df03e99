"""The text tables of the command line (processor/cli/common.py, cli/search.py): a run's tags
as one cell."""

from __future__ import annotations

from processor.cli.search import tags_cell


def test_tags_are_one_cell_by_key_and_a_dash_when_there_are_none() -> None:
    assert tags_cell({"team": "pay", "customer": "c1"}) == "customer=c1,team=pay"
    assert tags_cell({}) == "-"


def test_tags_past_the_cells_width_are_cut_with_an_ellipsis() -> None:
    cell = tags_cell({f"k{i}": "v" * 10 for i in range(10)})
    assert len(cell) == 48 and cell.endswith("...")
    assert cell.startswith("k0=vvvvvvvvvv,k1=")
