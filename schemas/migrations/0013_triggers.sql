-- Triggers (docs/requests.md#triggers): the records of a team's own topic mapped to start or
-- signal requests. The processors subscribe to every source topic named here and read the
-- table again every few seconds; definition is the JSON of core/triggers.py's Trigger.
-- One trigger per source topic: a record is one request, its offset passes once.
CREATE TABLE IF NOT EXISTS eec_trigger (
    name           text        PRIMARY KEY,
    source_topic   text        NOT NULL UNIQUE,
    definition     jsonb       NOT NULL,
    -- {"partition": offset}: the topic's end when the trigger was created, where a partition
    -- the group has no offset for starts (one not named starts at its beginning).
    start_offsets  jsonb       NOT NULL DEFAULT '{}'::jsonb,
    created_at     timestamptz NOT NULL DEFAULT now()
);
