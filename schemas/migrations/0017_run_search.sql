-- Runs you can search (docs/operations/runs.md#finding-runs): tags given at start, and an index
-- behind each filter of `ductor runs list` / `runs count` / bulk cancel and retry.
--
-- Every committed tick updates its run row and moves last_transition_at, which other indexes
-- hold, so the update is never HOT: each index of the run table that a live run is in costs
-- one index entry per commit. So every index here is partial, on ended runs: a run enters each
-- once, when it ends, and the ticks of live runs pay nothing for them. The live runs, few
-- beside the ended ones, are found through the watchdog's index of them (eec_workflow_run_stuck_
-- idx, on every pending or running run not quarantined) and filtered (io/postgres/run_search.py), and
-- the quarantined ones, rare, through an index of their own. The failed steps are
-- found in the step results (written once, never updated) by a partial index of failures.
-- Like 0003, built without CONCURRENTLY: on a large existing table, build these beforehand
-- with CREATE INDEX CONCURRENTLY under the same names (docs/operations/runs.md#finding-runs).
ALTER TABLE eec_workflow_run ADD COLUMN IF NOT EXISTS tags jsonb NOT NULL DEFAULT '{}'::jsonb;

CREATE INDEX IF NOT EXISTS eec_workflow_run_ended_created_idx
    ON eec_workflow_run (created_at, run_id)
    WHERE status IN ('succeeded', 'failed', 'cancelled');
CREATE INDEX IF NOT EXISTS eec_workflow_run_ended_workflow_idx
    ON eec_workflow_run (workflow_name, created_at, run_id)
    WHERE status IN ('succeeded', 'failed', 'cancelled');
CREATE INDEX IF NOT EXISTS eec_workflow_run_ended_status_idx
    ON eec_workflow_run (status, created_at, run_id)
    WHERE status IN ('succeeded', 'failed', 'cancelled');
CREATE INDEX IF NOT EXISTS eec_workflow_run_ended_tags_idx
    ON eec_workflow_run USING gin (tags jsonb_path_ops)
    WHERE status IN ('succeeded', 'failed', 'cancelled') AND tags <> '{}'::jsonb;
CREATE INDEX IF NOT EXISTS eec_workflow_run_quarantined_idx
    ON eec_workflow_run (quarantined_at) WHERE quarantined_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS eec_step_result_failed_idx
    ON eec_step_result (node_id, run_id) WHERE outcome = 'failed';

-- `--id-prefix` is a LIKE 'prefix%': the primary key serves it when the database's collation
-- is C (byte order, as `make up` creates it); under any other collation only an index with
-- text_pattern_ops can, so it is built only there (on ended runs, like the others).
DO $$
BEGIN
    IF (SELECT datcollate FROM pg_database WHERE datname = current_database())
            NOT IN ('C', 'POSIX') THEN
        CREATE INDEX IF NOT EXISTS eec_workflow_run_id_pattern_idx
            ON eec_workflow_run (run_id text_pattern_ops)
            WHERE status IN ('succeeded', 'failed', 'cancelled');
    END IF;
END
$$;
