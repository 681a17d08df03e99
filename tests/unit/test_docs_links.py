"""No link leaves the repository (issue 19): every link in the project's Markdown is relative,
to a file or folder of the repository that exists, and its anchor, if any, is a heading of
that file by GitHub's slug rule. The same holds for the `FILE.md#anchor` references the code,
the alert rules, the manifests and the docs' prose name."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

from tests.markdown import REPO, Link, anchors, links, markdown_files, slug

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_MENTION = re.compile(r"(?<![\w/.-])(?P<path>(?:[\w.-]+/)*[\w.-]+\.md)#(?P<anchor>[\w-]+)")
_MENTIONING = ["processor", "infra", "tests", "examples", "docs"]
_MENTIONING_FILES = ["README.md", "Makefile", "Dockerfile", "pyproject.toml", ".ci/run"]


def _anchors_of(path: Path) -> set[str]:
    return anchors(path.read_text())


def link_problem(source: Path, link: Link) -> str | None:
    """What is wrong with one link of ``source``, or None."""
    target, _, anchor = link.target.partition("#")
    where = f"{source.relative_to(REPO)}:{link.line}: {link.target}"
    if _SCHEME.match(link.target) or link.target.startswith("//"):
        return f"{where} leaves the repository (a URL)"
    if target.startswith("/"):
        return f"{where} is an absolute path: links are relative to the file"
    resolved = (source.parent / unquote(target)).resolve() if target else source
    if resolved != REPO and REPO not in resolved.parents:
        return f"{where} points outside the repository"
    if not resolved.exists():
        return f"{where} points to a file that does not exist"
    if anchor:
        if resolved.suffix != ".md":
            return f"{where} has an anchor into a file that is not Markdown"
        if anchor not in _anchors_of(resolved):
            return f"{where}: {resolved.relative_to(REPO)} has no heading with that anchor"
    return None


def test_the_slug_rule_is_github_s() -> None:
    assert slug("Data between steps and a run's output") == "data-between-steps-and-a-runs-output"
    assert slug("`ductor dlq list [--limit N] [--reason R]`") == (
        "ductor-dlq-list---limit-n---reason-r"
    )
    assert slug("One clock: Postgres's") == "one-clock-postgress"
    assert slug("Start permits and reruns in child processes: what they cost") == (
        "start-permits-and-reruns-in-child-processes-what-they-cost"
    )
    assert slug("DUCTOR_KAFKA_* properties") == "ductor_kafka_-properties"
    assert slug("**Bold** and [a link](x.md)") == "bold-and-a-link"
    text = "# Title\n\n## Same\n\n```sh\n# a comment, no heading\n```\n\n## Same\n\n### Same\n"
    assert anchors(text) == {"title", "same", "same-1", "same-2"}


@pytest.mark.parametrize(
    ("target", "problem"),
    [
        ("../../outside.md", "points outside the repository"),
        ("../../shared/DESIGN.md", "points outside the repository"),
        ("https://example.com/docs", "leaves the repository (a URL)"),
        ("file:///etc/hosts", "leaves the repository (a URL)"),
        ("/docs/operations.md", "is an absolute path"),
        ("missing.md", "does not exist"),
        ("operations.md#no-such-heading", "has no heading with that anchor"),
        ("../pyproject.toml#anchor", "not Markdown"),
    ],
)
def test_a_bad_link_is_found(target: str, problem: str) -> None:
    found = link_problem(REPO / "docs" / "a.md", Link(target, 1))
    assert found is not None and problem in found


def test_links_are_found_where_github_renders_them_and_not_in_code() -> None:
    text = (
        "A [link](a.md) and [one\nover two lines](b.md#x), <https://auto.example>, "
        "https://bare.example/path.\n\n`[not](code.md)` and\n\n```md\n[not](fenced.md)\n```\n"
        "\n[ref]: c.md\n"
    )
    assert [(link.target, link.line) for link in links(text)] == [
        ("a.md", 1),
        ("b.md#x", 1),
        ("c.md", 10),
        ("https://auto.example", 2),
        ("https://bare.example/path", 2),
    ]


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_link_of_the_markdown_stays_in_the_repository_and_resolves(path: Path) -> None:
    problems = [link_problem(path, link) for link in links(path.read_text())]
    assert [p for p in problems if p] == []


def test_every_markdown_anchor_the_repository_names_exists() -> None:
    """`docs/operations/alerts.md#ductorinstancedown` in an alert rule's comment, a docstring or
    a doc's prose: the file (from the repository's top, or beside the one that names it) and
    its heading."""
    paths = [REPO / name for name in _MENTIONING_FILES]
    for folder in _MENTIONING:
        paths += [p for p in (REPO / folder).rglob("*") if p.is_file() and p.suffix != ".pyc"]
    problems = []
    for path in paths:
        if not path.exists() or path == Path(__file__):
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for match in _MENTION.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            candidates = [REPO / match["path"], path.parent / match["path"]]
            target = next((c.resolve() for c in candidates if c.is_file()), None)
            if target is None or REPO not in target.parents:
                problems.append(f"{path.relative_to(REPO)}:{line}: {match[0]}: no such file")
            elif match["anchor"] not in _anchors_of(target):
                problems.append(f"{path.relative_to(REPO)}:{line}: {match[0]}: no such heading")
    assert problems == []
