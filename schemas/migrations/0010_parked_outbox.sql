-- An outbox row whose record the broker refuses for good (too large for its topic, not
-- authorised) is parked: kept with why, and relayed by no one, instead of being sent again by
-- every instance forever. `ductor outbox parked` lists them; `ductor outbox unpark` hands them
-- back to the relay once the cause is fixed.
ALTER TABLE eec_outbox ADD COLUMN IF NOT EXISTS parked_at timestamptz;
ALTER TABLE eec_outbox ADD COLUMN IF NOT EXISTS parked_reason text;
