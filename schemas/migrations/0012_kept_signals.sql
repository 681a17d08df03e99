-- Signals that reached the processor through ductor.requests before the run they name exists
-- (a producer's signal may race its start): kept here until the start arrives, which moves
-- them into eec_run_signal in the statement that creates the run, or until they expire
-- (DUCTOR_KEPT_SIGNAL_TTL_S), when a sweep dead-letters them as unknown_run with the
-- record's original key, value and headers and where it was read. No key to the run table:
-- the run does not exist yet.
CREATE TABLE IF NOT EXISTS eec_kept_signal (
    run_id            text        NOT NULL,
    signal_id         text        NOT NULL,
    kind              text        NOT NULL,
    payload           jsonb       NOT NULL DEFAULT '{}'::jsonb,
    shard             bigint      NOT NULL,  -- run_shard(run_id): the sweep's partition of work
    received_at       timestamptz NOT NULL DEFAULT now(),
    -- The record as it was read, for its dead letter: key and value bytes, headers as
    -- [[name, base64 value or null], ...], and its position.
    record_key        bytea,
    record_value      bytea       NOT NULL,
    record_headers    jsonb       NOT NULL DEFAULT '[]'::jsonb,
    source_topic      text        NOT NULL,
    source_partition  integer     NOT NULL,
    source_offset     bigint      NOT NULL,
    -- When a sweep sent its dead letter, and which instance (the row is deleted once the
    -- broker has it; sent again by another instance's sweep only once that one is gone).
    dead_letter_sent_at timestamptz,
    dead_letter_by      text,
    PRIMARY KEY (run_id, signal_id)
);
CREATE INDEX IF NOT EXISTS eec_kept_signal_received_idx ON eec_kept_signal (received_at);
