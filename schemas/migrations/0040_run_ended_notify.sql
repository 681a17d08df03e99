-- A run's end is told to whoever waits for it (the client's wait_for_run, `ductor result
-- --wait`, `ductor start --wait`): the row's change to a terminal status notifies channel
-- `ductor_run_ended` with the run id, in the transaction that ends it, whichever path wrote
-- it (a tick's commit, a force-fail, a cancel). Waiters LISTEN instead of polling the row.
-- The WHEN clause is evaluated in C for every updated row; the function, one pg_notify, runs
-- only for the update that ends a run (a notification is delivered once its transaction
-- commits, never for one that rolled back).
CREATE OR REPLACE FUNCTION ductor_notify_run_ended() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('ductor_run_ended', NEW.run_id);
    RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS eec_workflow_run_ended ON eec_workflow_run;
CREATE TRIGGER eec_workflow_run_ended
    AFTER UPDATE OF status ON eec_workflow_run
    FOR EACH ROW
    WHEN (NEW.status IN ('succeeded', 'failed', 'cancelled')
          AND OLD.status IN ('pending', 'running'))
    EXECUTE FUNCTION ductor_notify_run_ended();
