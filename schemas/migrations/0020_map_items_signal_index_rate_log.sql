-- Costs bounded by design (docs/performance.md#bounded-costs).
--
-- eec_map_item: the items of a map step that succeeded, each with its applied attempt, written
-- by the commit that took the item out of its run's state (core/map_items.py): the run row
-- holds only the map's counters and the items in flight, so a commit costs the same whatever
-- the map's size. The commit that ends the map reads them, by index, for its output.
CREATE TABLE IF NOT EXISTS eec_map_item (
    run_id   text    NOT NULL,
    node     text    NOT NULL,
    item     integer NOT NULL CHECK (item >= 0),  -- its index in the list
    attempt  integer NOT NULL CHECK (attempt >= 1),
    PRIMARY KEY (run_id, node, item)
);

-- The load reads, per run, the first signal of each name its wait steps wait for (and one
-- cancel), never every signal the run ever got: an index lookup per name.
CREATE INDEX IF NOT EXISTS eec_run_signal_first_idx
    ON eec_run_signal (run_id, kind, received_at, signal_id);

-- A rate limit's last dispatches (core/limits.py), one row each, numbered: admitting one
-- reads the few that bound its window (one range of the key) and writes one row, and the
-- commit deletes the one that fell out of the count, whatever the limit and the window.
-- `dispatched` on the counter's row is how many it counted; `recent` (the times kept as an
-- array, read and written whole at every admission) is no longer written by this version.
ALTER TABLE eec_limit ADD COLUMN IF NOT EXISTS dispatched bigint NOT NULL DEFAULT 0;
CREATE TABLE IF NOT EXISTS eec_limit_rate (
    key    text   NOT NULL,
    seq    bigint NOT NULL,
    at_ms  bigint NOT NULL,
    PRIMARY KEY (key, seq)
);
-- The windows counted so far carry over: each counter's kept times are its first dispatches.
INSERT INTO eec_limit_rate (key, seq, at_ms)
SELECT l.key, t.ord - 1, t.at
  FROM eec_limit l, unnest(l.recent) WITH ORDINALITY AS t(at, ord)
 WHERE l.key LIKE 'r/%' AND l.dispatched = 0
ON CONFLICT DO NOTHING;
UPDATE eec_limit SET dispatched = cardinality(recent)
 WHERE key LIKE 'r/%' AND dispatched = 0 AND cardinality(recent) > 0;
