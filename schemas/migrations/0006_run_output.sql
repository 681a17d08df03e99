-- A run's output: what its workflow declares as its result (the output of a named step, or a
-- small mapping of names to steps' outputs), written by the commit that ends the run
-- succeeded. NULL while the run is not succeeded, or when its workflow declares no output.
ALTER TABLE eec_workflow_run ADD COLUMN IF NOT EXISTS output jsonb;
