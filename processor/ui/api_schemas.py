"""The JSON schemas of the HTTP API's bodies and answers (the OpenAPI document's
``components.schemas``, api_spec.py): one place, so the document served and the validator of
each request body (api_spec.body_validator) read the same rules. Their bounds come from the
constants the client checks against (core/bounds.py, core/run_ids.py)."""

from __future__ import annotations

from typing import Any

from processor.core.envelope import MAX_RUN_ID_LENGTH
from processor.core.requests import MAX_NAME_LENGTH
from processor.core.routing import TIERS
from processor.core.run_search import MAX_TAG_VALUE, MAX_TAGS, TAG_KEY
from processor.core.run_state import RunStatus
from processor.core.workflow_def import MAX_TIMEOUT_MS, SIGNAL_NAME

_NAME = {"type": "string", "minLength": 1, "maxLength": MAX_NAME_LENGTH}
_TAGS = {
    "type": "object",
    "maxProperties": MAX_TAGS,
    "propertyNames": {"pattern": f"^{TAG_KEY.pattern}$"},
    "additionalProperties": {"type": "string", "maxLength": MAX_TAG_VALUE},
    "description": "names to strings (core/run_search.py says which names)",
}
_STATUS = {"enum": [s.value for s in RunStatus]}

SCHEMAS: dict[str, dict[str, Any]] = {
    "Error": {
        "type": "object",
        "required": ["status", "error", "reason"],
        "additionalProperties": False,
        "properties": {
            "status": {"type": "integer", "description": "the HTTP status, again"},
            "error": {"type": "string", "description": "a short name to act on"},
            "reason": {"type": "string", "description": "one sentence: what and why"},
        },
    },
    "StartRequest": {
        "type": "object",
        "required": ["workflow", "run_id"],
        "additionalProperties": False,
        "properties": {
            "workflow": _NAME,
            "run_id": {"type": "string", "minLength": 1, "maxLength": MAX_RUN_ID_LENGTH},
            "input": {"description": "any JSON value within the bounds of stored JSON"},
            "version": {"type": "integer", "minimum": 1, "description": "default: the latest"},
            "tier": {"enum": list(TIERS), "default": "t1"},
            "if_exists": {
                "enum": ["ignore", "fail"],
                "description": "absent: the same start again is ignored, another input refused",
            },
            "tags": _TAGS,
            "start_at": {
                "type": "string",
                "description": "ISO 8601 with its offset: the run starts then, not before",
            },
            "timeout_ms": {
                "type": "integer",
                "minimum": 1,
                "maximum": MAX_TIMEOUT_MS,
                "description": "how long the run may take from its start: past it, it fails"
                " (default: its workflow's timeout_ms, if it declares one)",
            },
        },
    },
    "StartedRun": {
        "type": "object",
        "required": ["run_id", "created", "announced"],
        "additionalProperties": False,
        "properties": {
            "run_id": {"type": "string"},
            "created": {"type": "boolean", "description": "false: it existed already"},
            "announced": {"type": "boolean", "description": "false: its wakeup waits a sweep"},
        },
    },
    "SignalRequest": {
        "type": "object",
        "required": ["name"],
        "additionalProperties": False,
        "properties": {
            "name": {"type": "string", "pattern": f"^{SIGNAL_NAME.pattern}$"},
            "payload": {"description": "any JSON value: the waiting step's output"},
            "signal_id": {
                **_NAME,
                "description": "the idempotency key (default: a new one)",
            },
        },
    },
    "SignalSent": {
        "type": "object",
        "required": ["signal_id", "new"],
        "additionalProperties": False,
        "properties": {"signal_id": {"type": "string"}, "new": {"type": "boolean"}},
    },
    "RetriedRun": {
        "type": "object",
        "required": ["run_id", "steps", "seq"],
        "additionalProperties": False,
        "properties": {
            "run_id": {"type": "string"},
            "steps": {"type": "array", "items": {"type": "string"}},
            "seq": {"type": "integer"},
        },
    },
    "UpgradeRequest": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "step": {"type": "string", "minLength": 1, "description": "only this step type"},
            "to_version": {
                "type": "integer",
                "minimum": 1,
                "maximum": 9999,
                "description": "the version to move to (needs step)",
            },
            "latest": {
                "type": "boolean",
                "description": "to the newest version the live workers serve",
            },
        },
    },
    "UpgradedRun": {
        "type": "object",
        "required": ["run_id", "moves"],
        "additionalProperties": False,
        "properties": {
            "run_id": {"type": "string"},
            "moves": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["step", "type", "from", "to"],
                    "properties": {
                        "step": {"type": "string"},
                        "type": {"type": "string"},
                        "from": {"type": "integer"},
                        "to": {"type": "integer"},
                    },
                },
            },
        },
    },
    "RunResult": {
        "type": "object",
        "required": ["run_id", "status", "finished", "output", "failure_reason"],
        "additionalProperties": False,
        "properties": {
            "run_id": {"type": "string"},
            "status": _STATUS,
            "finished": {"type": "boolean"},
            "output": {"description": "the run's output once it succeeded, else null"},
            "failure_reason": {"type": ["string", "null"]},
            "compensation": {
                "enum": ["none", "running", "completed", "failed", "stopped"],
                "description": "what became of the run's compensations (a saga): none ran,"
                " they run, they all completed, one failed for good, or the run was"
                " force-failed during them",
            },
        },
    },
    "RunSummary": {
        "type": "object",
        "required": [
            "run_id",
            "workflow",
            "version",
            "status",
            "created_at",
            "last_transition_at",
            "failure_reason",
            "quarantined",
            "tags",
        ],
        "additionalProperties": False,
        "properties": {
            "run_id": {"type": "string"},
            "workflow": {"type": "string"},
            "version": {"type": "integer"},
            "status": _STATUS,
            "created_at": {"type": ["string", "null"]},
            "last_transition_at": {"type": "string"},
            "failure_reason": {"type": ["string", "null"]},
            "quarantined": {"type": "boolean"},
            "tags": {"type": "object", "additionalProperties": {"type": "string"}},
        },
    },
    "RunPage": {
        "type": "object",
        "required": ["runs", "next_cursor"],
        "additionalProperties": False,
        "properties": {
            "runs": {"type": "array", "items": {"$ref": "#/components/schemas/RunSummary"}},
            "next_cursor": {"type": ["string", "null"]},
        },
    },
    "Document": {"type": "object", "required": ["openapi", "paths"]},
}
