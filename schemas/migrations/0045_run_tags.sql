-- Tags set by steps (docs/usage.md#tagging-runs-from-steps): `ctx.tag("customer", "c-42")` in a
-- step tags its run, found by `ductor runs list --tag customer=c-42` beside the tags given at
-- its start (eec_workflow_run.tags, 0017), which a step's value for the same key replaces. A
-- row per (run, key), written by the statement that records the result of the step that set
-- it, only if that result is a success it inserted (io/postgres/step_data.py): the run row is
-- written only by the coordinator's ticks, so the tags live beside it. Like the step results
-- (0011), no foreign key to the run: the insert reads whether the run exists, and retention
-- (`ductor gc`) deletes a run's tags with it.
--
-- Bounded as core/bounds.py says: a key as the tags' keys are (TAG_KEY), a value of at most
-- 200 characters, and at most 16 keys per run (MAX_STEP_TAGS). The count holds whoever
-- writes: every insert takes a lock on its run's tags for its transaction (an advisory lock:
-- the run's row is never locked) and then counts them, so two steps of one run that record
-- new keys at once take turns, and the second sees the first's keys. Writers insert in
-- (run, key) order, so two of them never wait for each other in a cycle.
CREATE TABLE IF NOT EXISTS eec_run_tag (
    run_id  text        NOT NULL,
    key     text        NOT NULL
        CONSTRAINT eec_run_tag_key_check CHECK (key ~ '^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,63}$'),
    value   text        NOT NULL
        CONSTRAINT eec_run_tag_value_check CHECK (char_length(value) <= 200),
    node_id text,
    set_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, key)
);

-- `runs list --tag KEY=VALUE`: the runs whose steps set that tag (io/postgres/run_search.py).
CREATE INDEX IF NOT EXISTS eec_run_tag_lookup_idx ON eec_run_tag (key, value, run_id);

-- The bound: a run keeps at most 16 keys set by its steps. The error is a check violation,
-- which the worker takes as final: its step fails, saying so (worker/database.py).
CREATE OR REPLACE FUNCTION eec_run_tag_bound() RETURNS trigger
LANGUAGE plpgsql AS $bound$
DECLARE
    kept integer;
BEGIN
    -- (1952540531: 'tags' read as an int4, the class of this table's advisory locks.)
    PERFORM pg_advisory_xact_lock(1952540531, hashtext(NEW.run_id));
    SELECT count(*) INTO kept FROM eec_run_tag WHERE run_id = NEW.run_id;
    IF kept > 16 THEN
        RAISE EXCEPTION 'run % keeps at most 16 tags set by its steps; with tag % it would have %',
                quote_literal(NEW.run_id), quote_literal(NEW.key), kept
            USING ERRCODE = 'check_violation',
                  HINT = 'a step may set a key the run has again: its value is replaced';
    END IF;
    RETURN NULL;
END
$bound$;

DROP TRIGGER IF EXISTS eec_run_tag_bound ON eec_run_tag;
CREATE TRIGGER eec_run_tag_bound AFTER INSERT ON eec_run_tag
    FOR EACH ROW EXECUTE FUNCTION eec_run_tag_bound();

-- The workers' role may write them (0023 says how the function is used; 0032 and 0041 what
-- else it grants, unchanged here).
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
    -- The tags the steps of successes set on their runs, written with the results
    -- (io/postgres/step_data.py); the bound's trigger counts a run's keys. (node_id is read
    -- too: an upsert's SET reads EXCLUDED.node_id, which takes SELECT on the column.)
    GRANT SELECT (run_id, key, value, node_id),
          INSERT (run_id, key, value, node_id),
          UPDATE (value, node_id, set_at)
        ON eec_run_tag TO ductor_worker;
    RETURN true;
END
$grant$;

SELECT ductor_grant_worker_role();
