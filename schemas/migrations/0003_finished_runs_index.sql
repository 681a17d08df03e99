-- Retention (`ductor gc --finished-before 7d`) deletes finished runs by when they last moved.
-- Partial, like the watchdog's indexes: a row enters it once, when its run ends, and the live
-- runs the processors update all the time are not in it. Built without CONCURRENTLY (migrations
-- run in a transaction): on a large existing run table, writes to it wait for the build, unless
-- it was built beforehand with CREATE INDEX CONCURRENTLY under this name (docs/operations/runs.md#retention).
CREATE INDEX IF NOT EXISTS eec_workflow_run_finished_idx ON eec_workflow_run (last_transition_at)
    WHERE status IN ('succeeded', 'failed', 'cancelled');
