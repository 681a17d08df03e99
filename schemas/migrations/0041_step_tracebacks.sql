-- What a failed attempt keeps besides its message (docs/usage.md#results-listing-and-retrying):
-- the type of the exception its step raised (`error` stays "Type: message", as the run's state
-- and its failure reason quote it) and its traceback, from the first frame of the user's code
-- on, bounded in lines and bytes (core/failures.py); or, when the step's process died under it,
-- a sentence saying there is none and why. NULL for results from before this migration, for
-- successes and for failures the worker decided (a deadline, an unknown step type).
ALTER TABLE eec_step_result
    ADD COLUMN IF NOT EXISTS error_type text,
    ADD COLUMN IF NOT EXISTS traceback  text;

-- The workers' role may write them (0023 says how the function is used; 0032 what else it
-- grants, unchanged here).
CREATE OR REPLACE FUNCTION ductor_grant_worker_role() RETURNS boolean
LANGUAGE plpgsql AS $grant$
DECLARE
    attempt_columns text;
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
          INSERT (run_id, node_id, attempt, outcome, output, error, retryable, error_type,
                  traceback)
        ON eec_step_result TO ductor_worker;
    -- Claims, reruns and claims given back (and, where they exist, late starts, heartbeats
    -- and the ends of executions).
    SELECT string_agg(quote_ident(c.column_name), ', ' ORDER BY c.ordinal_position)
        INTO attempt_columns
        FROM information_schema.columns c
        WHERE c.table_schema = current_schema() AND c.table_name = 'eec_step_attempt'
          AND c.column_name IN ('worker_id', 'starts', 'claim_seq', 'started_at', 'reports',
                                'beat_at', 'beat_details', 'ended_at');
    EXECUTE format('GRANT SELECT, INSERT, DELETE, UPDATE (%s) ON eec_step_attempt TO ductor_worker',
                   attempt_columns);
    -- Its own registration (with what it serves), heartbeat, partitions, start permit and clean
    -- stop (io/postgres/instances.py); whether another instance is alive, and what the other workers
    -- serve and hold. It forgets no one (only processors delete old rows).
    GRANT SELECT (instance_id, kind, heartbeat_at, stopped_at, started_through, group_id,
                  queues, step_types, partitions),
          INSERT (instance_id, kind, host, pid, group_id, name, queues, step_types,
                  concurrency, version, app, partitions),
          UPDATE (heartbeat_at, stopped_at, started_through, partitions)
        ON eec_instance TO ductor_worker;
    RETURN true;
END
$grant$;

SELECT ductor_grant_worker_role();
