-- A kept signal (eec_kept_signal, migration 0012) whose run then appears but cannot take it
-- (core/landing.py: no wait step of the run's workflow waits for its name, or the run had
-- ended when a sweep adopted the signal) is not applied: the start or the sweep that finds
-- this writes why here, and the next sweep of the shard's owner claims its dead letter
-- (refused_reason: unknown_signal or run_ended, refused_detail: the sentence) at once,
-- without waiting for a time to live.
ALTER TABLE eec_kept_signal ADD COLUMN IF NOT EXISTS refused_reason text;
ALTER TABLE eec_kept_signal ADD COLUMN IF NOT EXISTS refused_detail text;
-- The refused signals whose dead letter nobody claimed yet (a few, for a sweep interval).
CREATE INDEX IF NOT EXISTS eec_kept_signal_refused_idx ON eec_kept_signal (received_at)
    WHERE refused_reason IS NOT NULL AND dead_letter_sent_at IS NULL;
