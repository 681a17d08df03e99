-- Round-robin across run keys in a limit's line of waiters (core/limit_line.py): each waiter
-- carries its run's key (`run_key`: the value its workflow's `concurrency` counts it by, ''
-- for a run of a workflow without one) and the round it joined the line in, no earlier than
-- the round of the line's first waiter and after the last of its own run key's. The line is
-- read by round, then by age. Waiters from before wait in round 0, first as they were.
ALTER TABLE eec_limit_wait
    ADD COLUMN IF NOT EXISTS run_key text   NOT NULL DEFAULT '',
    ADD COLUMN IF NOT EXISTS round   bigint NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS eec_limit_wait_line
    ON eec_limit_wait (key, round, since_ms, run_id, node);
CREATE INDEX IF NOT EXISTS eec_limit_wait_run_key
    ON eec_limit_wait (key, run_key, round);
