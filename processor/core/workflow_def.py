"""A workflow's definition as the core holds it: steps (``StepDef``), their retry policies and
dependencies, a workflow's declared output and the JSON Schema its input must match. Frozen
values, no I/O; the one JSON form of them is read and written by core/workflow.py (the parser
of each step: core/step_parse.py), and the authoring API (processor/authoring.py) builds
these same values.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property

from processor.core.conditions import Condition
from processor.core.limit_defs import ConcurrencyLimit, RunKeyLimit, StepRateLimit
from processor.core.routing import DEFAULT_QUEUE
from processor.core.selectors import Selector
from processor.core.shapes import WorkflowKey


class ValidationError(ValueError):
    """Input that cannot be accepted; the message says what is wrong and where."""


# A queue's name goes into a topic name (``<prefix>.steps.<queue>``).
QUEUE_NAME = re.compile(r"[A-Za-z0-9_-]{1,100}")

# The longest wait between two attempts a workflow may declare: a retry timer's target is
# never further ahead than this (intake.py rejects a wakeup that says otherwise).
MAX_BACKOFF_MS = 7 * 24 * 3600 * 1000
# The longest a step's timeouts may be: ten years (a due time stays within the bounds of an
# epoch in ms every door checks).
MAX_TIMEOUT_MS = 10 * 365 * 24 * 3600 * 1000


# The highest version a step type's function may have (``@registry.step(t, version=N)``, a
# step's ``"version"``): it travels in tasks and the registry as ``type@N``.
MAX_STEP_VERSION = 9_999


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 3
    backoff_ms: int = 100
    backoff_multiplier: float = 2.0
    max_backoff_ms: int = 60_000

    def delay_after(self, attempt: int) -> int:
        """The wait before attempt ``attempt + 1`` once attempt ``attempt`` (from 1) failed."""
        raw = self.backoff_ms * self.backoff_multiplier ** max(0, attempt - 1)
        return int(min(raw, self.max_backoff_ms))


TASK, WAIT, WORKFLOW, MAP = "task", "wait", "workflow", "map"  # the kinds of step
SLEEP = "sleep"
# What a wait step does when its last attempt times out: fail (the default) or succeed with
# its default output and let the run go on.
ON_TIMEOUT_FAIL, ON_TIMEOUT_CONTINUE = "fail", "continue"
# A step's ``run_if``: by default a step whose dependencies were all skipped is skipped too;
# one with ``run_if: all_done`` runs once they all ended, skipped or not (core/skips.py).
RUN_IF_ALL_DONE = "all_done"
# A signal's name: what ``ductor signal RUN NAME`` sends and a wait step waits for.
SIGNAL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}")
# A wait step waits a week unless it says otherwise (a person may be away).
WAIT_TIMEOUT_MS = 7 * 24 * 3600 * 1000
# A child workflow's step waits a day for its child run unless it says otherwise.
CHILD_TIMEOUT_MS = 24 * 3600 * 1000
# A map step runs at most this many items (``max_items``, default MAP_ITEMS), this many at once
# (``parallelism``, default MAP_PARALLELISM).
MAP_ITEMS, MAP_ITEMS_LIMIT = 1_000, 10_000
MAP_PARALLELISM, MAP_PARALLELISM_LIMIT = 10, 1_000


# The nodes of a failed run's handler (core/sagas.py): ``failure``, what the run's failure
# was (an output the tick makes), and ``on_failure``, the handler's task, which reads it.
FAILURE_NODE, ON_FAILURE_NODE = "failure", "on_failure"


def undo_node(step: str) -> str:
    """The node of the compensation of step ``step`` in a run's state (core/sagas.py)."""
    return f"undo({step})"


def item_node(step: str, index: int) -> str:
    """The node of item ``index`` of map step ``step`` in a run's state."""
    return f"{step}[{index}]"


@dataclass(frozen=True)
class StepDef:
    name: str
    step_type: str  # the function a worker runs ("" for a wait step: no worker runs it)
    depends_on: tuple[str, ...] = ()
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    # Start-to-close: how long an attempt may run, counted from the moment a worker starts it
    # (its claim, io/postgres/step_attempts.py), never from its dispatch: time in a queue does not
    # count (core/tick.py, rule 4). A wait step's: how long it waits; a workflow step's: how
    # long its child run may take.
    timeout_ms: int = 30_000
    # The queue whose workers run it: each queue is a steps topic of its own (routing.py).
    queue: str = DEFAULT_QUEUE
    # A long step calls ``ctx.heartbeat()`` at least this often, or its attempt fails without
    # waiting for its deadline. None: no heartbeat is expected.
    heartbeat_timeout_ms: int | None = None
    # Schedule-to-start: how long an attempt may wait in its queue for a worker to start it;
    # past it the step fails, final. None: as long as it takes.
    schedule_to_start_ms: int | None = None
    # Schedule-to-close: how long the step may take in all, from the dispatch of its first
    # attempt (since the run was last resumed) to the end of its last; past it the step
    # fails, final. None: no bound.
    schedule_to_close_ms: int | None = None
    # "task": a worker runs it; "wait": it waits for the first signal named ``signal`` sent
    # to the run (before it or while it waits), and its output is that signal's payload.
    kind: str = TASK
    signal: str | None = None
    # "workflow": it starts a run of ``child_workflow`` (its ``child_version``, or the latest
    # when None) with the run's input, or the output of ``input_from`` (a dependency), and
    # ends as that child run does: its output the child's, or failed with its failure.
    child_workflow: str | None = None
    child_version: int | None = None
    input_from: str | None = None
    # "map": one attempt of ``step_type`` per item of a list, the run's input (``items_from``
    # None) or a dependency's output, at most ``max_items`` of them and ``parallelism`` at
    # once, each retried by the step's policy; its output is the items' outputs, in order.
    items_from: str | None = None
    max_items: int = MAP_ITEMS
    parallelism: int = MAP_PARALLELISM
    # Bounds on its dispatches, counted across runs (core/limits.py); for task and map steps.
    concurrency: ConcurrencyLimit | None = None
    rate_limit: StepRateLimit | None = None
    # "sleep": no worker runs it; it ends ``sleep_ms`` after it starts, or at the time its
    # ``until`` selector finds in the run (core/sleeps.py). Its output: {"slept_until_ms": t}.
    sleep_ms: int | None = None
    until: Selector | None = None
    # A wait step's: what its last attempt's timeout does (ON_TIMEOUT_FAIL or _CONTINUE),
    # and, when it continues, its output as canonical JSON text (None: null).
    on_timeout: str = ON_TIMEOUT_FAIL
    default_output: str | None = None
    # Any kind's: the condition it runs on (``when``; core/conditions.py), false: skipped;
    # ``run_if`` None or RUN_IF_ALL_DONE (core/skips.py).
    when: Condition | None = None
    run_if: str | None = None
    # A task or map step's: the version of its step type's function every run runs
    # (``"version": 2``); None: a run runs the newest version live workers serve when it
    # starts (core/versions.py).
    version: int | None = None
    # A task step's compensation (core/sagas.py): the task that undoes it, run when the run
    # fails or is cancelled after it succeeded; a task step of its own named ``undo(step)``,
    # depending on the step (it reads the step's output and the run's input). None: none.
    compensate: StepDef | None = None

    @property
    def selectors(self) -> tuple[Selector, ...]:
        """The selectors it reads of its run before it starts (its ``until``, its condition's):
        the load reads what they find (io/postgres/selected.py)."""
        read = () if self.when is None else self.when.selectors
        return read if self.until is None else (self.until, *read)

    @property
    def limited(self) -> bool:
        return self.concurrency is not None or self.rate_limit is not None

    @property
    def waits(self) -> bool:
        return self.kind == WAIT

    @property
    def sleeps(self) -> bool:
        return self.kind == SLEEP

    @property
    def continues_on_timeout(self) -> bool:
        return self.on_timeout == ON_TIMEOUT_CONTINUE

    @property
    def starts_child(self) -> bool:
        return self.kind == WORKFLOW

    @property
    def maps(self) -> bool:
        return self.kind == MAP

    @property
    def runs_on_a_worker(self) -> bool:
        """Whether its attempts are sent to the workers (a map's are its items')."""
        return self.kind == TASK


@dataclass(frozen=True)
class WorkflowOutput:
    """What a succeeded run stores as its output (``eec_workflow_run.output``): the output of
    one step (``step``), or a mapping of names to steps' outputs (``fields``, sorted by name:
    a JSON object's keys have no order, and the stored definition, jsonb, keeps none of its
    own, so a definition read back must equal the one registered)."""

    step: str | None = None
    fields: tuple[tuple[str, str], ...] = ()

    def to_json(self) -> str | dict[str, str]:
        return self.step if self.step is not None else dict(self.fields)


@dataclass(frozen=True)
class WorkflowDef:
    name: str
    version: int
    steps: tuple[StepDef, ...]
    output: WorkflowOutput | None = None  # None: the workflow declares no output
    # The JSON Schema (draft 2020-12) a run's input must match, as canonical JSON text (keys
    # sorted: a value, compared and hashed as one); None: any input (core/run_input.py).
    input_schema: str | None = None
    # How long a run may take from its start (core/deadlines.py): past it, it fails; a start
    # may give a run its own. None: no deadline.
    timeout_ms: int | None = None
    # At most so many live runs per value of a path in the input (core/run_keys.py); None:
    # runs start as they come.
    concurrency: RunKeyLimit | None = None
    # The task run once when a run fails (core/sagas.py), node ``on_failure``, reading the
    # failure (``failure``); None: none.
    on_failure: StepDef | None = None

    @property
    def key(self) -> WorkflowKey:
        return (self.name, self.version)

    @cached_property
    def step_map(self) -> dict[str, StepDef]:
        """Steps by name, with their compensations' (``undo(step)``: core/sagas.py), computed
        once per definition (definitions are immutable)."""
        steps = {s.name: s for s in self.steps}
        steps.update((c.name, c) for c in self.compensations)
        if self.on_failure is not None:
            steps[ON_FAILURE_NODE] = self.on_failure
            steps[FAILURE_NODE] = StepDef(FAILURE_NODE, "", kind=FAILURE_NODE)
        return steps

    @cached_property
    def compensations(self) -> tuple[StepDef, ...]:
        """Its steps' compensations (core/sagas.py), in definition order; empty for most."""
        return tuple(s.compensate for s in self.steps if s.compensate is not None)

    @cached_property
    def compensates(self) -> bool:
        """Whether a step has a compensation or the workflow a failure handler: only then
        does a failed or cancelled run run a saga before it ends (core/sagas.py)."""
        return bool(self.compensations) or self.on_failure is not None

    def step_for(self, node: str) -> StepDef:
        """The step a node of a run's state is of: a step, or an item of a map step
        (``resize[3]``)."""
        step = self.step_map.get(node)
        if step is None and node.endswith("]") and "[" in node:
            step = self.step_map.get(node[: node.rindex("[")])
            if step is not None and not step.maps:
                step = None
        if step is None:
            raise KeyError(node)
        return step

    @cached_property
    def only_tasks(self) -> bool:
        """Whether every step is a task that always runs (the tick's fast path: no wait, map,
        child or sleep, no condition)."""
        return all(s.kind == TASK for s in self.steps) and not self.decides

    @cached_property
    def decides(self) -> bool:
        """Whether a step has a condition: only then may a step be skipped (core/skips.py)."""
        return any(s.when is not None for s in self.steps)

    @cached_property
    def has_limits(self) -> bool:
        """Whether a step bounds its dispatches, or the workflow its live runs per key
        (core/limits.py): the batch counts them."""
        return self.concurrency is not None or any(s.limited for s in self.steps)

    @cached_property
    def has_maps(self) -> bool:
        return any(s.maps for s in self.steps)

    @cached_property
    def signals(self) -> frozenset[str]:
        """The names its wait steps wait for (a signal of another name, but ``cancel``,
        would change nothing: core/landing.py refuses it)."""
        return frozenset(s.signal for s in self.steps if s.waits and s.signal is not None)

    @cached_property
    def sleeps(self) -> tuple[StepDef, ...]:
        """Its sleep steps (core/sleeps.py), in definition order."""
        return tuple(s for s in self.steps if s.sleeps)

    @cached_property
    def selects(self) -> tuple[StepDef, ...]:
        """Its steps that read values of the run before they start (a sleep's ``until``, a
        condition): the load reads what their selectors find while they have not started
        (io/postgres/selected.py). Empty for most workflows, whose loads read nothing more."""
        return tuple(s for s in self.steps if s.selectors)

    @cached_property
    def code_steps(self) -> tuple[StepDef, ...]:
        """Its steps a worker runs a function for (task and map steps): those a run pins a
        version of (core/versions.py)."""
        return tuple(s for s in self.steps if s.kind == TASK or s.maps)

    @cached_property
    def saga_steps(self) -> tuple[StepDef, ...]:
        """Its steps' compensations and its failure handler (core/sagas.py): tasks no run
        pins a version of; each runs the version it declares, else 1."""
        handler = () if self.on_failure is None else (self.on_failure,)
        return (*self.compensations, *handler)

    @cached_property
    def declares_versions(self) -> bool:
        """Whether a step says which version of its function every run runs."""
        return any(s.version is not None for s in self.steps)

    @cached_property
    def has_children(self) -> bool:
        """Whether a step starts child runs (what the commit path then looks for)."""
        return any(s.starts_child for s in self.steps)

    @property
    def queues(self) -> list[str]:
        """The queues its steps run on, sorted."""
        return sorted({s.queue for s in (*self.steps, *self.saga_steps)})

    def step(self, name: str) -> StepDef:
        for step in self.steps:
            if step.name == name:
                return step
        raise KeyError(name)
