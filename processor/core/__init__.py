"""The pure core: everything the processor decides, and nothing it does.

No I/O, no clock, no randomness, nothing of Kafka, Postgres or OpenTelemetry (the linter
enforces it: see ``[tool.ruff.lint.flake8-tidy-imports]`` in pyproject.toml). Time comes in as
an argument, and decisions go out as frozen values that the engine carries out.

- ``tick``: every state transition of a run (rules at the top of the file), with what it
  decides (``tick_decision``), an attempt's moves and timeouts (``attempts``), map steps'
  items (``map_steps``) and how a run ends or is resumed (``run_ends``).
- ``decide``: what becomes of a batch's runs once loaded and committed, as frozen ``Plan``\\ s
  (``plans``: the record and one payload type per kind of outcome).
- ``intake``: the verdict on each consumed record; ``pending``: coalescing and parking.
- ``policy``: the seed's conflict policy; ``routing``: topics, tiers, the delay ladder,
  partition choice; ``offsets``, ``flow``: which offsets are safe, pauses and tier weights.
- ``workflow``: a definition's JSON form, its one parser and one writer (the values in
  ``workflow_def``, each step's parser in ``step_parse``; ``durations`` for code-first ones).
- ``limits``: concurrency and rate limits decided across a batch (shapes in ``limit_values``).
- ``model``, ``run_state``, ``load_row``, ``envelope``, ``step_task``, ``records``,
  ``dead_letters``: the data and codecs (``load_row``: the load's row read by name);
  ``outcomes``: the names everything is counted and dead-lettered by; ``stats``: the counters;
  ``backoff``: the wait before the next try at a dependency that is down.
- ``batch``: the batch's database protocol, a generator of requests the engine's stage
  answers (its values in ``batch_values``); ``stuck``, ``children``, ``child_graph``: the
  watchdog's verdict, child runs and their cycles.
- What starts a tick's steps and ends them: ``ready``, ``wait_steps``, ``sleeps``,
  ``conditions``, ``skips``, ``selectors``, ``deadlines``; what a dispatch carries
  (``dataflow``, ``effects``) and how a failure is kept (``failures``).
- The worker's decisions: ``claims``, ``claim_pace``, ``handback``; a group member stuck:
  ``membership``.
- The doors: ``bounds``, ``run_ids``, ``scopes``, ``landing``, ``run_input``; requests,
  triggers and schedules (``requests``, ``request_plans``, ``triggers``, ``schedules``,
  ``cron``); ``limit_defs``, ``workflow_source``.
- What a look at runs asks and shows: ``run_search``, ``shown``, ``run_tally``; the shared
  small shapes: ``shapes``.
"""
