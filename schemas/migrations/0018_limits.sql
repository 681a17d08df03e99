-- Concurrency and rate limits at dispatch (core/limits.py; docs/usage.md#limits).
--
-- eec_limit: one row per counter (`c/NAME/VALUE` or `r/NAME`), written only by commits that
-- counted on it: its version moves with every slot taken, every wait begun and every slot
-- freed, so two instances counting from the same version cannot both take the last slot.
-- `recent`: a rate counter's last dispatch times (epoch ms), at most its limit of them.
CREATE TABLE IF NOT EXISTS eec_limit (
    key      text   PRIMARY KEY,
    version  bigint NOT NULL,
    recent   bigint[] NOT NULL DEFAULT '{}'
);

-- The attempts in flight that hold a concurrency slot, written and deleted by the commits
-- that dispatch and end them (a run's row is the truth; this is its count, kept with it).
CREATE TABLE IF NOT EXISTS eec_limit_hold (
    run_id   text    NOT NULL,
    node     text    NOT NULL,
    attempt  integer NOT NULL,
    key      text    NOT NULL,
    PRIMARY KEY (run_id, node, attempt, key)
);
CREATE INDEX IF NOT EXISTS eec_limit_hold_key ON eec_limit_hold (key);

-- Nodes waiting for room, oldest first per counter: who is let in next, and whom a freed slot
-- wakes (on the run's tier).
CREATE TABLE IF NOT EXISTS eec_limit_wait (
    key       text   NOT NULL,
    run_id    text   NOT NULL,
    node      text   NOT NULL,
    since_ms  bigint NOT NULL,
    tier      text   NOT NULL,
    PRIMARY KEY (run_id, node, key)
);
CREATE INDEX IF NOT EXISTS eec_limit_wait_queue ON eec_limit_wait (key, since_ms, run_id, node);
