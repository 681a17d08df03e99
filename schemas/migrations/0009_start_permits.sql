-- A claim is not a start: a worker claims tasks ahead of its free slots, and one that dies
-- leaves claims it never started. Each claim carries the worker's sequence number
-- (`claim_seq`), and the worker keeps in its instance row the number through which its claims
-- may have started (`started_through`), raised before it starts any task beyond it. A claim
-- of a worker that is gone, with a number past its `started_through`, never started: the next
-- worker takes it as new, not as the rerun of a crash. NULL `claim_seq`: started at its claim
-- (a rerun, or a row written before this migration).
ALTER TABLE eec_step_attempt ADD COLUMN IF NOT EXISTS claim_seq bigint;
ALTER TABLE eec_instance ADD COLUMN IF NOT EXISTS started_through bigint NOT NULL DEFAULT 0;
