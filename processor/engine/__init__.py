"""The running processor: the poll loop (``processor``), the one executor of the commit path
(``executor``, counting in ``ledger``), the database access per thread (``database``), the
watchdog, the health endpoints, consumer lag, and the step worker."""
