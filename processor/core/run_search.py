"""What a search for runs asks (pure): tags a run carries, the filter of `ductor runs list`,
`runs count` and the bulk actions, and the cursor that pages through a listing.

The SQL that answers a filter is in io/postgres/run_search.py; here are the rules a filter and its
parts must follow, checked before any statement runs, so a bad one is refused with what to fix.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import orjson

from processor.core.bounds import MAX_STEP_TAGS, MAX_TAG_VALUE, MAX_TAGS, TAG_KEY
from processor.core.run_state import RunStatus

__all__ = [
    "MAX_STEP_TAGS",
    "MAX_TAGS",
    "MAX_TAG_VALUE",
    "TAG_KEY",
    "Cursor",
    "RunFilter",
    "parse_tag",
    "parse_tags",
    "step_tag_problem",
    "tags_problem",
]


def tags_problem(tags: Any) -> str | None:
    """Why ``tags`` cannot be a run's tags, or None: an object of at most MAX_TAGS keys (1 to
    64 letters, digits, '_', '.', ':', '/' or '-') whose values are strings of at most
    MAX_TAG_VALUE characters. Tags are for finding runs, so they are small and flat."""
    if not isinstance(tags, Mapping):
        return f"tags are an object of names to strings, not {type(tags).__name__}"
    if len(tags) > MAX_TAGS:
        return f"a run has at most {MAX_TAGS} tags, not {len(tags)}"
    for key, value in tags.items():
        if not isinstance(key, str) or not TAG_KEY.fullmatch(key):
            return (
                f"tag name {key!r}: 1 to 64 letters, digits, '_', '.', ':', '/' or '-',"
                " starting with a letter or digit"
            )
        if not isinstance(value, str) or len(value) > MAX_TAG_VALUE or "\x00" in value:
            return f"tag {key!r}: its value is a string of at most {MAX_TAG_VALUE} characters"
        if not value.isascii() and not _is_unicode(value):
            return f"tag {key!r}: its value holds a lone surrogate: it is not Unicode text"
    return None


def step_tag_problem(key: Any, value: Any, kept: Mapping[str, str]) -> str | None:
    """Why a step may not set tag ``key`` = ``value`` on its run (``ctx.tag``), having set
    ``kept`` already in this attempt, or None: a tag as ``tags_problem`` takes it, and at
    most MAX_STEP_TAGS keys (setting a key again replaces its value and takes no room)."""
    if not isinstance(key, str):
        return f"a tag's name is a string, not {type(key).__name__}"
    problem = tags_problem({key: value})
    if problem is not None:
        return problem
    if key not in kept and len(kept) >= MAX_STEP_TAGS:
        return (
            f"a run keeps at most {MAX_STEP_TAGS} tags set by its steps: this attempt set"
            f" {len(kept)} already ({', '.join(sorted(kept))}), so not {key!r} too"
        )
    return None


def _is_unicode(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def parse_tag(text: str) -> tuple[str, str]:
    """``key=value`` (as `--tag` takes it) as a pair; ValueError saying what is wrong."""
    key, sep, value = text.partition("=")
    if not sep:
        raise ValueError(f"a tag is KEY=VALUE, not {text!r}")
    problem = tags_problem({key: value})
    if problem is not None:
        raise ValueError(problem)
    return key, value


def parse_tags(texts: list[str] | None) -> dict[str, str]:
    """Several ``key=value``; a key given twice is refused (which value was meant?)."""
    tags: dict[str, str] = {}
    for text in texts or []:
        key, value = parse_tag(text)
        if key in tags and tags[key] != value:
            raise ValueError(f"tag {key!r} given twice, with {tags[key]!r} and {value!r}")
        tags[key] = value
    problem = tags_problem(tags)
    if problem is not None:
        raise ValueError(problem)
    return tags


@dataclass(frozen=True)
class RunFilter:
    """Which runs: every field given narrows the set (AND); an empty filter is every run.
    ``since_ms``/``until_ms`` (epoch ms) bound when the run was created (since inclusive,
    until exclusive);
    ``step_failed`` keeps the runs with a failed attempt of that step (a map's items too)."""

    workflow: str | None = None
    statuses: tuple[RunStatus, ...] = ()
    since_ms: int | None = None
    until_ms: int | None = None
    id_prefix: str | None = None
    tags: tuple[tuple[str, str], ...] = ()
    step_failed: str | None = None

    def __post_init__(self) -> None:
        since, until = self.since_ms, self.until_ms
        if since is not None and until is not None and since >= until:
            raise ValueError("the window's start (since) is not before its end (until)")
        if self.id_prefix == "":
            raise ValueError("an id prefix is at least one character")
        problem = tags_problem(dict(self.tags))
        if problem is not None:
            raise ValueError(problem)

    @property
    def empty(self) -> bool:
        """True when nothing narrows the set (a bulk action refuses it)."""
        return self == RunFilter()

    def within(self, statuses: tuple[RunStatus, ...]) -> RunFilter:
        """This filter, kept to runs in one of ``statuses`` (those a bulk action can act on):
        the statuses asked for that are among them, or all of them when none was asked. A
        filter that asked only for others matches nothing, which ``nothing`` says."""
        kept = tuple(s for s in self.statuses if s in statuses) if self.statuses else statuses
        return replace(self, statuses=kept)

    def matches_nothing(self, statuses: tuple[RunStatus, ...]) -> bool:
        return bool(self.statuses) and not any(s in statuses for s in self.statuses)


@dataclass(frozen=True, order=True)
class Cursor:
    """Where a listing (newest first: by created_at, then run id, both descending) stopped:
    the next page starts after this run. Opaque to users: a short url-safe string."""

    created_us: int  # created_at in microseconds since the epoch (exact: what Postgres keeps)
    run_id: str

    def encode(self) -> str:
        raw = orjson.dumps([self.created_us, self.run_id])
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @staticmethod
    def decode(text: str) -> Cursor:
        """The cursor ``encode`` wrote; ValueError for anything else."""
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
            created_us, run_id = orjson.loads(raw)
        except (binascii.Error, orjson.JSONDecodeError, ValueError, TypeError):
            raise ValueError(f"not a cursor this listing gave: {text!r}") from None
        if not isinstance(created_us, int) or not isinstance(run_id, str):
            raise ValueError(f"not a cursor this listing gave: {text!r}")
        return Cursor(created_us, run_id)
