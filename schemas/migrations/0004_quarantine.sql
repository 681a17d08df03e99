-- Quarantine: a run whose row the processors cannot use (changed out of band, unreadable, of a
-- workflow that is not registered, or one that makes a statement fail) is flagged once, so the
-- watchdog's sweeps stop re-waking it (and dead-lettering its wakeup again) on every pass; a
-- thousand of them would otherwise fill each sweep's limit. The run's state is not touched.
-- `ductor inspect` shows the flag; `ductor runs release` clears it once the row is repaired.
ALTER TABLE eec_workflow_run
    ADD COLUMN IF NOT EXISTS quarantined_at    timestamptz,
    ADD COLUMN IF NOT EXISTS quarantine_reason text;

-- The sweeps' indexes leave quarantined runs out (rebuilt: same caveat as 0003 on a large table).
DROP INDEX IF EXISTS eec_workflow_run_due_idx;
CREATE INDEX eec_workflow_run_due_idx ON eec_workflow_run (next_wakeup_at)
    WHERE status IN ('pending', 'running') AND quarantined_at IS NULL;
DROP INDEX IF EXISTS eec_workflow_run_stuck_idx;
CREATE INDEX eec_workflow_run_stuck_idx ON eec_workflow_run (last_transition_at)
    WHERE status IN ('pending', 'running') AND quarantined_at IS NULL;
