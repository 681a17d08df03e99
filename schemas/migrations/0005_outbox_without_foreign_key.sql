-- The outbox's foreign key to the run table goes: an outbox row is only ever written by the
-- commit statement, for the run that same statement has just updated, so the reference holds
-- by construction, and checking it cost a trigger call per committed transition (a third of
-- the batched commit's time at 500 runs). Runs are deleted with their outbox rows explicitly
-- (`ductor gc`), no longer by cascade.
ALTER TABLE eec_outbox DROP CONSTRAINT IF EXISTS eec_outbox_run_id_fkey;
