-- The durable tables of the coordinator (the eec_ prefix marks Ductor's durable Enterprise
-- Eventing Core tables). The run row is written only by committed ticks (the conditional
-- UPDATE on db_record_version); step results and signals are append-only, idempotently keyed,
-- and written by their producers.

CREATE TABLE eec_workflow_definition (
    name           text        NOT NULL,
    version        integer     NOT NULL CHECK (version >= 1),
    definition     jsonb       NOT NULL,
    registered_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (name, version)
);

CREATE TABLE eec_workflow_run (
    run_id               text        PRIMARY KEY,
    workflow_name        text        NOT NULL,
    workflow_version     integer     NOT NULL,
    status               text        NOT NULL
        CHECK (status IN ('pending', 'running', 'succeeded', 'failed', 'cancelled')),
    node_states          jsonb       NOT NULL,
    last_transition_seq  bigint      NOT NULL DEFAULT 0,
    state_checksum       text        NOT NULL,
    db_record_version    bigint      NOT NULL DEFAULT 1,
    next_wakeup_at       timestamptz,
    failure_reason       text,
    -- The wakeup tier the run's own wakeups use (t0 interactive, t1 normal, t2 bulk).
    tier                 text        NOT NULL DEFAULT 't1' CHECK (tier IN ('t0', 't1', 't2')),
    -- A stable hash of run_id (crc32), so sweeps can be split by wakeup partition with no lock.
    shard                bigint      NOT NULL,
    input                jsonb       NOT NULL DEFAULT '{}'::jsonb,
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now(),
    last_transition_at   timestamptz NOT NULL DEFAULT now(),
    FOREIGN KEY (workflow_name, workflow_version) REFERENCES eec_workflow_definition (name, version)
);

-- The watchdog's two sweeps only look at live runs.
CREATE INDEX eec_workflow_run_due_idx ON eec_workflow_run (next_wakeup_at)
    WHERE status IN ('pending', 'running');
CREATE INDEX eec_workflow_run_stuck_idx ON eec_workflow_run (last_transition_at)
    WHERE status IN ('pending', 'running');

CREATE TABLE eec_step_result (
    run_id       text        NOT NULL REFERENCES eec_workflow_run (run_id) ON DELETE CASCADE,
    node_id      text        NOT NULL,
    attempt      integer     NOT NULL CHECK (attempt >= 1),
    outcome      text        NOT NULL CHECK (outcome IN ('succeeded', 'failed')),
    output       jsonb,
    error        text,
    recorded_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, node_id, attempt)
);

CREATE TABLE eec_run_signal (
    run_id       text        NOT NULL REFERENCES eec_workflow_run (run_id) ON DELETE CASCADE,
    signal_id    text        NOT NULL,
    kind         text        NOT NULL CHECK (kind IN ('cancel')),
    payload      jsonb       NOT NULL DEFAULT '{}'::jsonb,
    received_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, signal_id)
);
