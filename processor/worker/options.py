"""How one worker runs: its queues, how many steps at once, in threads or processes, and
what it does with a step that outlives its deadline or kills its process. Set by `ductor
worker`'s flags (docs/operations/workers.md)."""

from __future__ import annotations

from dataclasses import dataclass

from processor.core.routing import DEFAULT_QUEUE

ISOLATIONS = ("thread", "process")


@dataclass(frozen=True)
class WorkerOptions:
    # The most step functions running at once: each plain one on a thread of its own.
    concurrency: int = 8
    # The most tasks held waiting to run (read, being claimed, or claimed and waiting for a
    # slot); claims go ahead of the free slots as far as core/claim_pace.py says, up to this.
    # Past it the worker pauses its partitions and keeps polling (the group never takes it
    # for dead however long a step takes). None: 16 per slot, at least 512.
    prefetch: int | None = None
    queues: tuple[str, ...] = (DEFAULT_QUEUE,)
    # "thread": steps run in the worker's process (cheapest); "process": each slot is a child
    # process, so a hung step is killed at its deadline and a crashing one takes only its
    # child down (isolation.py).
    isolation: str = "thread"
    # A step still running this long after its deadline is abandoned: its slot is freed (its
    # attempt has timed out at the coordinator, which retries it by its policy).
    abandon_after_s: float = 5.0
    # Abandoned steps still running (threads cannot be killed) past which the worker stops,
    # with exit code 5 (worker.EXIT_ABANDONED), for its supervisor to start a fresh process.
    # None: ``concurrency``.
    max_abandoned: int | None = None
    # How many more times an attempt runs after the worker running it died (the step killed
    # its process, the OOM killer): past that the attempt fails ("the worker died running it")
    # and its retry policy decides, instead of a crash loop. Each rerun runs in a child process
    # of its own: a rerun that kills its process fails its attempt then and there.
    crash_reruns: int = 1
    # The registry's MODULE:ATTRIBUTE, for the child processes (None: the samples, or the
    # module attribute that holds the worker's registry: worker/app.py).
    app: str | None = None
    # Reruns run in a child process of their own (False: in the worker's own threads, where
    # a rerun that kills its process again takes the worker and its other tasks with it).
    reruns_in_child: bool = True

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if self.prefetch is not None and self.prefetch < 1:
            raise ValueError("prefetch must be at least 1")
        if not self.queues:
            raise ValueError("a worker serves at least one queue")
        if self.isolation not in ISOLATIONS:
            raise ValueError(f"isolation must be one of {', '.join(ISOLATIONS)}")
        if self.abandon_after_s < 0:
            raise ValueError("abandon_after_s must be >= 0")
        if self.crash_reruns < 0:
            raise ValueError("crash_reruns must be >= 0")

    @property
    def held_limit(self) -> int:
        return max(512, 16 * self.concurrency) if self.prefetch is None else self.prefetch

    @property
    def abandoned_limit(self) -> int:
        return self.concurrency if self.max_abandoned is None else self.max_abandoned

    @property
    def max_starts(self) -> int:
        return 1 + self.crash_reruns
