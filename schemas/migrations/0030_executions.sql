-- The life of a step's execution as its worker reports it (docs/usage.md, "Timeouts" and
-- "Heartbeats"; docs/operations/workers.md).
--
-- eec_step_attempt, beside the claim: `started_at` is the execution's start (the claim, moved to
-- the start on a slot when that came later), what its start-to-close timeout counts from;
-- `beat_at` and `beat_details` the last heartbeat recorded, and what the step said with it (the
-- coordinator judges heartbeat timeouts from it, `ductor inspect` shows it, the next attempt
-- reads it as `ctx.last_heartbeat`); `ended_at` when the execution ended, however it did (its
-- function returned, its child process was killed). `reports`: the claim is of a worker that
-- records its beats and the end of its executions; for one of a worker from before (false),
-- neither its silence nor a missing end means anything, and it is judged as before.
ALTER TABLE eec_step_attempt
    ADD COLUMN IF NOT EXISTS reports      boolean NOT NULL DEFAULT false,
    ADD COLUMN IF NOT EXISTS beat_at      timestamptz,
    ADD COLUMN IF NOT EXISTS beat_details jsonb,
    ADD COLUMN IF NOT EXISTS ended_at     timestamptz;

-- A concurrency slot is held by an execution, not an attempt (core/limits.py, rule 4): when the
-- commit that ends an attempt finds its execution still running (a step in a thread, which
-- cannot be stopped, after a timeout or a cancel), the slot stays, marked with when that was,
-- until the execution ends or its worker is gone (the watchdog frees it: io/postgres/limit_store.py).
ALTER TABLE eec_limit_hold ADD COLUMN IF NOT EXISTS lingering_since timestamptz;
CREATE INDEX IF NOT EXISTS eec_limit_hold_lingering ON eec_limit_hold (lingering_since)
    WHERE lingering_since IS NOT NULL;

-- The workers' role may write what they report (0023 says how the function is used).
CREATE OR REPLACE FUNCTION ductor_grant_worker_role() RETURNS boolean
LANGUAGE plpgsql AS $grant$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'ductor_worker') THEN
        BEGIN
            CREATE ROLE ductor_worker NOLOGIN;
        EXCEPTION
            WHEN insufficient_privilege THEN
                RAISE WARNING 'role ductor_worker was not created: % may not create roles', current_user
                    USING HINT = 'as a role with CREATEROLE: CREATE ROLE ductor_worker NOLOGIN; then, as '
                        || current_user || ': SELECT ductor_grant_worker_role();'
                        || ' (docs/operations/access.md#the-workers-database-role)';
                RETURN false;
            WHEN duplicate_object OR unique_violation THEN
                NULL;  -- created meanwhile (another database of the cluster migrating)
        END;
    END IF;
    EXECUTE format('GRANT USAGE ON SCHEMA %I TO ductor_worker', current_schema());
    EXECUTE format('REVOKE ALL ON ALL TABLES IN SCHEMA %I FROM ductor_worker', current_schema());
    -- Claims and the check that an attempt still matters (io/postgres/step_attempts.py), the data a
    -- task does not carry and the test that a result's run exists (io/postgres/step_data.py).
    GRANT SELECT (run_id, workflow_name, workflow_version, status, node_states, input)
        ON eec_workflow_run TO ductor_worker;
    GRANT SELECT (name, version, definition) ON eec_workflow_definition TO ductor_worker;
    GRANT SELECT (run_id, node_id, attempt, output),
          INSERT (run_id, node_id, attempt, outcome, output, error, retryable)
        ON eec_step_result TO ductor_worker;
    -- Claims, reruns and claims given back; late starts, heartbeats and the ends of
    -- executions.
    GRANT SELECT, INSERT, DELETE,
          UPDATE (worker_id, starts, claim_seq, started_at, reports, beat_at, beat_details,
                  ended_at)
        ON eec_step_attempt TO ductor_worker;
    -- Its own registration, heartbeat, start permit and clean stop (io/postgres/instances.py); whether
    -- another instance is alive. It forgets no one (only processors delete old rows).
    GRANT SELECT (instance_id, kind, heartbeat_at, stopped_at, started_through),
          INSERT (instance_id, kind, host, pid),
          UPDATE (heartbeat_at, stopped_at, started_through)
        ON eec_instance TO ductor_worker;
    RETURN true;
END
$grant$;

SELECT ductor_grant_worker_role();
