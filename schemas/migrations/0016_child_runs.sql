-- Child workflows (docs/usage.md#child-workflows): a run started by a step of kind workflow
-- names its parent run, the step and the attempt whose result its end is.
ALTER TABLE eec_workflow_run ADD COLUMN IF NOT EXISTS parent_run_id text;
ALTER TABLE eec_workflow_run ADD COLUMN IF NOT EXISTS parent_node text;
ALTER TABLE eec_workflow_run ADD COLUMN IF NOT EXISTS parent_attempt integer;
CREATE INDEX IF NOT EXISTS eec_workflow_run_parent ON eec_workflow_run (parent_run_id)
    WHERE parent_run_id IS NOT NULL;
