"""Which existing runs a start refuses (processor/client/starts.py), and the flag that says so."""

from __future__ import annotations

import pytest

from processor import client
from processor.cli.main import parse_args
from processor.client import IfExists
from processor.client.starts import _refused
from processor.io.postgres.runs_admin import ExistingRun

SAME = ExistingRun("r", ("orders", 1), same_input=True)
OTHER_INPUT = ExistingRun("r", ("orders", 1), same_input=False)
NEWER_VERSION = ExistingRun("r", ("orders", 2), same_input=True)
OTHER_WORKFLOW = ExistingRun("r", ("billing", 1), same_input=True)


@pytest.mark.parametrize(
    ("run", "policy", "refused"),
    [
        (SAME, None, False),  # the same start again: the same run
        (NEWER_VERSION, None, False),  # the workflow is its name; the version is not compared
        (OTHER_INPUT, None, True),
        (OTHER_INPUT, IfExists.IGNORE, False),
        (SAME, IfExists.FAIL, True),
        (OTHER_WORKFLOW, None, True),
        (OTHER_WORKFLOW, IfExists.IGNORE, True),  # whatever the policy
    ],
)
def test_which_existing_runs_a_start_refuses(
    run: ExistingRun, policy: IfExists | None, refused: bool
) -> None:
    assert _refused(run, "orders", policy) is refused


def test_the_policy_is_a_flag_of_ductor_start_and_a_parameter_of_the_client() -> None:
    assert parse_args(["start", "orders"]).if_exists is None
    assert parse_args(["start", "orders", "--if-exists", "ignore"]).if_exists == "ignore"
    with pytest.raises(SystemExit) as info:
        parse_args(["start", "orders", "--if-exists", "replace"])
    assert info.value.code == 2
    assert issubclass(client.RunExists, client.ClientError)
    assert {"IfExists", "RunExists"} <= set(client.__all__)
