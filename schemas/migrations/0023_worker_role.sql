-- The role step workers connect as (docs/operations/access.md#the-workers-database-role): a group
-- role without login, `ductor_worker`; a deployment creates a login role in it for its workers
-- and gives them its DSN (DUCTOR_WORKER_PG_DSN):
--
--     CREATE ROLE ductor_worker_login LOGIN PASSWORD '...' IN ROLE ductor_worker;
--
-- It may do what a worker does and nothing else: claim step attempts (eec_step_attempt), record
-- results (eec_step_result: insert only), read what steps need (a run's input and node states,
-- the definitions, the outputs of recorded results), keep its own row in the instance registry
-- (eec_instance: register, heartbeat, start permit, stopped) and read whether the others are
-- alive. No write to a run row, a signal, the outbox, a definition, a trigger, a schedule or a
-- limit; no read of them beyond those columns.
--
-- A role belongs to the cluster, and creating one needs CREATEROLE. A migrating role without it
-- leaves the role uncreated, with a WARNING (`ductor migrate` logs it), and the migration
-- applies all the same: an administrator creates the role (`CREATE ROLE ductor_worker
-- NOLOGIN;`), then the owner of the tables (the role that migrates) grants it its privileges
-- with `SELECT ductor_grant_worker_role();`. The function may run any number of times: it
-- revokes whatever the role held on this schema's tables and grants exactly the list below, so
-- a later migration that changes what workers read replaces the function and calls it again.
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
    -- Claims, reruns and claims given back.
    GRANT SELECT, INSERT, DELETE, UPDATE (worker_id, starts, claim_seq, started_at)
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

REVOKE ALL ON FUNCTION ductor_grant_worker_role() FROM PUBLIC;

SELECT ductor_grant_worker_role();
