"""The files the package ships beside its code (migrations, JSON schemas, sample workflows),
and the JSON schema check of a workflow definition."""
