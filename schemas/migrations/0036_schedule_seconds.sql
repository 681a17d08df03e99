-- A schedule's seconds in a column of their own (docs/usage.md#delayed-starts-and-schedules):
-- its cron expression has five fields as cron has them, never six, because six fields are
-- read two ways (croniter: seconds last; Quartz and Spring: seconds first), and
-- `*/10 * * * * *`, meant as every ten seconds, fired every second. NULL: at second 0 of each
-- minute the five fields match.
ALTER TABLE eec_schedule ADD COLUMN IF NOT EXISTS seconds text;

-- The schedules stored with six fields were read with the seconds last (croniter's order, the
-- only one taken until now): they keep that meaning, the sixth field moved to `seconds`.
UPDATE eec_schedule
   SET seconds = (regexp_split_to_array(btrim(cron), '\s+'))[6],
       cron = array_to_string((regexp_split_to_array(btrim(cron), '\s+'))[1:5], ' ')
 WHERE cardinality(regexp_split_to_array(btrim(cron), '\s+')) = 6;

-- And none is stored with six again: a row written by hand with six fields is refused here,
-- rather than read one way or the other at its fire.
ALTER TABLE eec_schedule DROP CONSTRAINT IF EXISTS eec_schedule_cron_not_six_fields;
ALTER TABLE eec_schedule ADD CONSTRAINT eec_schedule_cron_not_six_fields
    CHECK (cardinality(regexp_split_to_array(btrim(cron), '\s+')) <> 6);
