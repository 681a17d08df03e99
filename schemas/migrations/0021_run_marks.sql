-- The run row is written only by versioned writes (docs/guarantees.md, "One writer of the run
-- row"): the watchdog's re-wake marks (0008) and the quarantine flags (0004) wrote it without
-- moving its version, up to a third of all its writes through an outage. They move to tables
-- of their own, keyed by run id, and their columns go.
--
-- When the overdue sweep last re-woke a run (io/postgres/sweeps.py): upserted by the sweep, read by both
-- sweeps through the primary key for each run their index scans reach.
CREATE TABLE IF NOT EXISTS eec_run_rewake (
    run_id     text PRIMARY KEY,
    rewoken_at timestamptz NOT NULL
);

-- A run whose row the processors cannot use (io/postgres/run_marks.py): the flag holds for the row's
-- version it was decided on (run_version) and for no other. A run that commits a transition
-- again (repaired, then woken) moves its version and so leaves the flag behind without writing
-- it; `ductor runs release` deletes the flag and moves the version, so that a flag decided
-- before the release, still on its way, is written on a version the row no longer has.
CREATE TABLE IF NOT EXISTS eec_run_quarantine (
    run_id         text PRIMARY KEY,
    run_version    bigint      NOT NULL,
    quarantined_at timestamptz NOT NULL,
    reason         text        NOT NULL
);

INSERT INTO eec_run_rewake (run_id, rewoken_at)
SELECT run_id, rewoken_at FROM eec_workflow_run WHERE rewoken_at IS NOT NULL
ON CONFLICT (run_id) DO NOTHING;
INSERT INTO eec_run_quarantine (run_id, run_version, quarantined_at, reason)
SELECT run_id, db_record_version, quarantined_at, coalesce(quarantine_reason, '')
  FROM eec_workflow_run WHERE quarantined_at IS NOT NULL
ON CONFLICT (run_id) DO NOTHING;

-- The sweeps' indexes hold every live run again (the flag is no longer a column of the row):
-- a sweep passes a quarantined run over by a primary-key probe of eec_run_quarantine. Rebuilt
-- inside this transaction, like 0004's: on a large run table, writes to it wait for the builds.
DROP INDEX IF EXISTS eec_workflow_run_due_idx;
CREATE INDEX eec_workflow_run_due_idx ON eec_workflow_run (next_wakeup_at)
    WHERE status IN ('pending', 'running');
DROP INDEX IF EXISTS eec_workflow_run_stuck_idx;
CREATE INDEX eec_workflow_run_stuck_idx ON eec_workflow_run (last_transition_at)
    WHERE status IN ('pending', 'running');
DROP INDEX IF EXISTS eec_workflow_run_quarantined_idx;

ALTER TABLE eec_workflow_run
    DROP COLUMN IF EXISTS rewoken_at,
    DROP COLUMN IF EXISTS quarantined_at,
    DROP COLUMN IF EXISTS quarantine_reason;
