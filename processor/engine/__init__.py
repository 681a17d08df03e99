"""The running processor: the poll loop (``processor``, its parts built by ``assembly``
around one injected clock: ``intake``, ``pace`` and ``flow_control``, ``membership``, ``lag``),
the one executor of the commit path (``executor``; its database stage on a thread of its own:
``stage``, ``stage_thread``, ``stage_failures``; its plans settled by ``settling``, the
acknowledged outbox rows in ``acknowledged``, all counted and traced in ``ledger``), the
database access per thread (``database``), the runs woken again (``rewake``,
``recent_commits``), the requests desk and the triggers followed (``request_desk``,
``trigger_follow``), the watchdog's sweeps (``watchdog``, carried out by ``sweeps``) and the
health probe (``health``).
"""
