-- A cancel kept for a run that does not exist yet (eec_kept_signal, migration 0012) no longer
-- expires: it waits for its run's start however late it comes (a start after it must not run
-- as if never cancelled), and `ductor gc` deletes those kept longer than the finished runs it
-- keeps. The sweep that dead-letters the other kept signals once their time to live has passed
-- reads this partial index, which holds only the signals that may expire, so cancels kept for
-- long cost it nothing. (eec_kept_signal_received_idx stays: gc finds the old cancels by it.)
CREATE INDEX IF NOT EXISTS eec_kept_signal_expiring_idx ON eec_kept_signal (received_at)
    WHERE dead_letter_sent_at IS NULL AND kind <> 'cancel';
-- The signals whose dead letter an instance claimed (a few, for seconds): the same sweep looks
-- for those whose instance is gone, through this index rather than the whole table.
CREATE INDEX IF NOT EXISTS eec_kept_signal_claimed_idx ON eec_kept_signal (received_at)
    WHERE dead_letter_sent_at IS NOT NULL;
