-- The transactional outbox: the records a committed transition must produce (step tasks,
-- retry timers), written by the same statement as the transition itself, so a crash between
-- the commit and the produce cannot lose them. The committing instance produces them at once
-- and deletes the row when the broker acknowledged them; a row left behind (its instance died,
-- the broker was away) is claimed by any instance's relay after a few seconds and sent again.
CREATE TABLE eec_outbox (
    run_id      text        NOT NULL REFERENCES eec_workflow_run (run_id) ON DELETE CASCADE,
    seq         bigint      NOT NULL,  -- the transition (last_transition_seq) that produced it
    records     jsonb       NOT NULL,  -- [[topic, key, value, co-partition run id or null], ...]
    created_at  timestamptz NOT NULL DEFAULT now(),  -- moved forward when a relay claims it
    PRIMARY KEY (run_id, seq)
);
CREATE INDEX eec_outbox_created_idx ON eec_outbox (created_at);
