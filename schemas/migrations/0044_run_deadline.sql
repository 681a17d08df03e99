-- A run's deadline (core/deadlines.py): the timeout it was started with (the workflow's
-- `timeout_ms`, or the start's own), and when it must have ended: the time it may start (its
-- creation, or its delayed start) plus that timeout. Written with the run; `ductor runs retry`
-- sets the deadline again from the retry. NULL for a run without one (and every run from
-- before), which the load then reads as a null.
ALTER TABLE eec_workflow_run
    ADD COLUMN IF NOT EXISTS timeout_ms  bigint,
    ADD COLUMN IF NOT EXISTS deadline_at timestamptz;
