"""A steps module of the tests' own, as a user's would be (`ductor worker --app
tests.integration.failing_steps:registry`), whose steps fail the ways a look at a run must
show: ``charge`` raises KeyError from a helper of its own (the traceback's first frame must be
``charge``), ``hostile`` raises an exception whose message is markup, ``crash`` kills its
process (no traceback can be kept), ``echo`` returns a value holding markup."""

from __future__ import annotations

import os
import signal
from typing import Any

from processor.worker import StepContext, StepRegistry

HOSTILE = "<script>document.title='owned'</script>"

registry = StepRegistry()


def payer(order: dict[str, Any]) -> Any:
    return order["by"]


@registry.step("charge")
def charge(ctx: StepContext) -> Any:
    return {"charged": payer(ctx.input)}


@registry.step("echo")
def echo(ctx: StepContext) -> Any:
    return {"order": ctx.input.get("order"), "note": HOSTILE}


@registry.step("hostile")
def hostile(ctx: StepContext) -> Any:
    raise ValueError(HOSTILE)


@registry.step("crash")
def crash(ctx: StepContext) -> Any:
    os.kill(os.getpid(), signal.SIGKILL)
