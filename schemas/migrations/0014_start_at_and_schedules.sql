-- Runs started for later, and schedules (docs/usage.md#delayed-starts-and-schedules).
--
-- start_at: a pending run does not start before it (its tick is a no-op until then; the
-- overdue sweep wakes it once next_wakeup_at, set to the same time, has passed). NULL: at once.
ALTER TABLE eec_workflow_run ADD COLUMN IF NOT EXISTS start_at timestamptz;

-- A schedule starts a run of its workflow at each fire time of its cron expression, in its
-- time zone. The processors fire the schedules of the shards they own, in their sweep; the
-- run id derives from the schedule and the fire time (name@2026-12-04T10:15:00Z), so two
-- instances firing at once start one run. catch_up: how many fires missed during an outage
-- (more than a minute late) still start a run; 0 skips them.
CREATE TABLE IF NOT EXISTS eec_schedule (
    name              text        PRIMARY KEY,
    cron              text        NOT NULL,
    tz                text        NOT NULL DEFAULT 'UTC',
    workflow_name     text        NOT NULL,
    workflow_version  integer,    -- NULL: the latest version at each fire
    input             jsonb       NOT NULL DEFAULT '{}'::jsonb,
    tier              text        NOT NULL DEFAULT 't1',
    catch_up          integer     NOT NULL DEFAULT 0 CHECK (catch_up >= 0),
    shard             bigint      NOT NULL,
    next_fire_at      timestamptz NOT NULL,
    last_fired_at     timestamptz,
    last_run_id       text,
    fires             bigint      NOT NULL DEFAULT 0,
    missed            bigint      NOT NULL DEFAULT 0,
    paused_at         timestamptz,
    created_at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS eec_schedule_due ON eec_schedule (next_fire_at)
    WHERE paused_at IS NULL;
