"""`ductor gc`: its durations and its bad usage (exit 2 before anything connects)."""

from __future__ import annotations

import pytest

from processor.cli.gc import parse_duration
from processor.cli.main import main, parse_args


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("30m", 1800), ("12h", 43_200), ("7d", 604_800), (" 1d ", 86_400)],
)
def test_durations(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["7", "7w", "0d", "0s", "-1d", "1.5h", "d", "", "1d2h", "7D"])
def test_a_duration_it_cannot_read_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="is not a duration such as 90s, 30m, 12h or 7d"):
        parse_duration(text)


def test_the_options() -> None:
    args = parse_args(["gc", "--finished-before", "7d"])
    assert (args.finished_before, args.batch_size, args.dry_run) == ("7d", 1000, False)
    args = parse_args(["gc", "--finished-before=30m", "--batch-size", "50", "--dry-run"])
    assert (args.finished_before, args.batch_size, args.dry_run) == ("30m", 50, True)


@pytest.mark.parametrize(
    "argv",
    [
        ["gc", "--finished-before", "7w"],
        ["gc", "--finished-before=-1d"],
        ["gc", "--finished-before", "7d", "--batch-size", "0"],
    ],
)
def test_bad_usage_is_one_sentence_and_exit_2(
    argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Nothing listens here: a command that got as far as connecting would fail with exit 1.
    monkeypatch.setenv("DUCTOR_PG_DSN", "postgresql://nobody@127.0.0.1:1/none")
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert not captured.out
    assert captured.err.startswith("ductor: --") and captured.err.count("\n") == 1
