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


def test_a_tags_control_characters_are_escaped_and_the_row_stays_one_line() -> None:
    # A step may tag its run with any string but NUL: an escape sequence or a line break
    # from it must not reach the terminal or split the row.
    assert tags_cell({"k": "a\nb\x1b[2J"}) == "k=a\\nb\\x1b[2J"
