-- Versioned step code (docs/usage.md#versioned-step-code): the version of its step type's
-- function each attempt ran with, as the run pinned it (core/versions.py) and the worker that
-- claimed it wrote it (io/postgres/step_attempts.py); shown by `ductor inspect` and the run's
-- page beside the attempt. NULL: claimed by a worker from before versions (version 1), or an
-- attempt marked never started. The run's pins themselves live in its state (node_states:
-- a step's "version", when it is not 1). The workers' role inserts the column with its claims
-- (0023 grants INSERT on the whole table); a claim taken over keeps the attempt's version.
ALTER TABLE eec_step_attempt ADD COLUMN IF NOT EXISTS step_version integer;
