-- When the watchdog last re-woke a run that was overdue (io/postgres/sweeps.py): a run stays overdue
-- while its wakeup waits in a backlog, and re-waking it on every sweep only grew that backlog.
-- A run is re-woken again only once it has been overdue since for longer than it was at the
-- previous re-wake (and at least the grace): the re-wakes of one run spread out, doubling.
ALTER TABLE eec_workflow_run ADD COLUMN IF NOT EXISTS rewoken_at timestamptz;
