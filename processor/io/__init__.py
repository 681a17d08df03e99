"""The shell's adapters, one sub-package per concern: ``postgres`` (all SQL), ``kafka``,
``telemetry`` (traces, metrics, logs), ``config`` (the typed settings), ``runtime`` (the
process's clock, threads, faults, outages and health server) and ``shipped`` (the package's
files). They import the core, never the engine or the worker."""
