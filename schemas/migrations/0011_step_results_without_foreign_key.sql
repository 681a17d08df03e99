-- The step results' foreign key to the run table goes, as the outbox's (0005) and the step
-- attempts' (0007) did: its check took a FOR KEY SHARE lock on the run's row for every result
-- inserted, a lock Postgres writes into the row itself (and shares with the commit's lock as
-- a multixact), which made a result cost twice the insert (docs/performance.md); and a row an
-- outside transaction held made results wait. The worker's insert now reads whether the run
-- exists instead (a result of a run that is gone is dropped, visibly), and `ductor gc` deletes
-- results with their run explicitly, no longer by cascade.
ALTER TABLE eec_step_result DROP CONSTRAINT IF EXISTS eec_step_result_run_id_fkey;
