-- Who is alive, which attempts have started, and which failures are final.
--
-- eec_instance: every processor and worker registers itself at start, writes a heartbeat about
-- once a second and marks itself stopped on a clean shutdown. Nothing holds a lock or a lease
-- through it: it only answers "is the instance that wrote this row gone?", for the outbox
-- relay (re-send only what no live producer holds) and for a worker that meets a task another
-- worker started (run it again only if that worker died).
CREATE TABLE eec_instance (
    instance_id   text        PRIMARY KEY,
    kind          text        NOT NULL CHECK (kind IN ('processor', 'worker')),
    host          text        NOT NULL,
    pid           integer     NOT NULL,
    started_at    timestamptz NOT NULL DEFAULT now(),
    heartbeat_at  timestamptz NOT NULL DEFAULT now(),
    stopped_at    timestamptz
);

-- The instance that committed an outbox row (or relays it now). NULL for rows written before
-- this migration and for rows a client wrote: those are relayed after DUCTOR_RELAY_AFTER_S, as
-- before.
ALTER TABLE eec_outbox ADD COLUMN IF NOT EXISTS owner text;

-- One row per step attempt a worker claimed: written before the step function runs, so a task
-- redelivered after its worker died is known to have started, and is not run again more often
-- than the worker allows. `starts` counts the executions begun. No foreign key to the run: the
-- claim reads the run row in the same statement, and checking the key cost a row lock on the
-- run per claim (taken while the coordinator updates the same rows: a claim took twice as long
-- under load). Runs are deleted with their attempts explicitly (`ductor gc`).
CREATE TABLE eec_step_attempt (
    run_id      text        NOT NULL,
    node_id     text        NOT NULL,
    attempt     integer     NOT NULL CHECK (attempt >= 1),
    worker_id   text        NOT NULL,
    starts      integer     NOT NULL DEFAULT 1,
    started_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, node_id, attempt)
);

-- A failure the step declared final (raise NonRetryable): the node fails at once, whatever
-- attempts its retry policy has left.
ALTER TABLE eec_step_result ADD COLUMN IF NOT EXISTS retryable boolean NOT NULL DEFAULT true;
