-- What a version registered from Python keeps besides its JSON (docs/usage.md#workflows-in-python):
-- the text of the module that created its `Workflow`, bounded (core/workflow_source.py: 64 KiB,
-- cut with a line that says so), the module's name, and when that text was kept. The latest
-- registration from code replaces them (the definition, by which versions are compared, is
-- unchanged: a different one is refused); one from JSON leaves them. NULL for versions only
-- ever registered from JSON. Only `ductor workflows register` writes them: the workers' role
-- reads (name, version, definition) alone, so its grant (0041) is unchanged.
ALTER TABLE eec_workflow_definition
    ADD COLUMN IF NOT EXISTS source        text,
    ADD COLUMN IF NOT EXISTS source_module text,
    ADD COLUMN IF NOT EXISTS source_at     timestamptz;
