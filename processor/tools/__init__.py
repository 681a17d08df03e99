"""Tools on top of the package, each imported only by its command (the CLI loads them lazily):
the live demo (``demo``); the benchmark (``bench``, its phases, harness and report in
``bench_*``) and its micro-benchmarks; the chaos run (``chaos``, its plan, fleet, load, hostile
records, checks and report in ``chaos_*``); the failover measurement (``failover``).

What the chaos run shares with the integration tests: the audit trail of committed writes and
its checks (``audit``), the freezing TCP proxy (``proxy``), restarts of the local services
(``local_infra``, on the checkout's infra/local.py that ``checkout`` finds), the one way to
spawn a ``ductor`` child (``child``), polling with a deadline (``waiting``) and dropping the
scratch databases they make (``databases``).
"""
