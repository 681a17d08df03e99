"""The running processor: the poll loop (``processor``, its parts built by ``assembly``:
``intake``, ``pace``, ``membership``, ``sweeps``), the one executor of the commit path
(``executor``, its plans settled by ``settling``, counted in ``ledger``), the database access
per thread (``database``), the watchdog, the health endpoints and consumer lag."""
