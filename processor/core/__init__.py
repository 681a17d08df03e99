"""The pure core: everything the processor decides, and nothing it does.

No I/O, no clock, no randomness, nothing of Kafka, Postgres or OpenTelemetry (the linter
enforces it: see ``[tool.ruff.lint.flake8-tidy-imports]`` in pyproject.toml). Time comes in as
an argument, and decisions go out as frozen values that the engine carries out.

- ``tick``: every state transition of a run (rules at the top of the file).
- ``decide``: what becomes of a batch's runs once loaded and committed, as frozen ``Plan``\\ s.
- ``intake``: the verdict on each consumed record; ``pending``: coalescing and parking.
- ``policy``: the seed's conflict policy; ``routing``: topics, tiers, the delay ladder,
  partition choice; ``offsets``, ``flow``: which offsets are safe, pauses and tier weights.
- ``model``, ``envelope``, ``step_task``, ``records``, ``dead_letters``: the data and codecs;
  ``outcomes``: the names everything is counted and dead-lettered by; ``stats``: the counters.
"""
