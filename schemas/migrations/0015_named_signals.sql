-- Signals that carry data (docs/usage.md#signals-and-wait-steps): besides 'cancel', a signal
-- may have any name a wait step waits for, with a JSON payload (the step's output).
ALTER TABLE eec_run_signal DROP CONSTRAINT IF EXISTS eec_run_signal_kind_check;
ALTER TABLE eec_run_signal DROP CONSTRAINT IF EXISTS eec_run_signal_name_check;
ALTER TABLE eec_run_signal ADD CONSTRAINT eec_run_signal_name_check
    CHECK (kind ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}$');
