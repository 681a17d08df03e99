"""The repository's Dockerfile read as instructions and build stages, without Docker: enough
for a file we write ourselves (no heredocs, no parser directives beyond the syntax line).
Shared by tests/unit/test_k8s_manifests.py, which checks what the image installs and runs,
and tests/integration/test_wheel.py, which runs the image's install instruction into a clean
virtualenv and uses what it installed against the services."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = REPO / "Dockerfile"


@dataclass(frozen=True)
class Instruction:
    keyword: str
    rest: str


def instructions(path: Path = DOCKERFILE) -> list[Instruction]:
    """The Dockerfile's instructions, continuation lines joined and comments dropped."""
    found, pending = [], ""
    for line in path.read_text().splitlines():
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        if text.endswith("\\"):
            pending += text[:-1] + " "
            continue
        keyword, _, rest = (pending + text).partition(" ")
        found.append(Instruction(keyword.upper(), rest.strip()))
        pending = ""
    return found


def stages(path: Path = DOCKERFILE) -> list[tuple[str, list[Instruction]]]:
    """(image, instructions) of each build stage, the ARG defaults before the first FROM
    substituted into the image."""
    args: dict[str, str] = {}
    found: list[tuple[str, list[Instruction]]] = []
    for instruction in instructions(path):
        if instruction.keyword == "ARG" and not found:
            name, _, default = instruction.rest.partition("=")
            args[name] = default
        elif instruction.keyword == "FROM":
            image = re.sub(r"\$\{(\w+)\}", lambda m: args[m[1]], instruction.rest)
            found.append((image, []))
        else:
            found[-1][1].append(instruction)
    return found


def final(keyword: str, path: Path = DOCKERFILE) -> str:
    """The runtime stage's last instruction of a kind: the one in force."""
    found = [i.rest for i in stages(path)[-1][1] if i.keyword == keyword]
    assert found, f"the runtime stage has no {keyword}"
    return found[-1]


def runtime_env(path: Path = DOCKERFILE) -> dict[str, str]:
    """The variables the runtime stage's ENV instructions set (``KEY=value`` pairs), as
    written: ``$PATH`` and the like are not expanded."""
    env: dict[str, str] = {}
    for instruction in stages(path)[-1][1]:
        if instruction.keyword == "ENV":
            for pair in shlex.split(instruction.rest):
                name, _, value = pair.partition("=")
                env[name] = value
    return env


# The build stage's instruction that installs the wheel into the image's virtualenv.
_INSTALL = re.compile(r"python -m venv (?P<venv>\S+)\s+&&\s+(?P=venv)/bin/pip install (?P<what>.+)")


@dataclass(frozen=True)
class WheelInstall:
    """How the image installs the project: a shell command that creates ``venv`` and installs
    the wheel built into ``dist`` (``what``: the argument pip is given)."""

    command: str
    venv: str
    what: str
    dist: str


def wheel_install(path: Path = DOCKERFILE) -> WheelInstall:
    """The build stage's RUN that creates the virtualenv and installs the built wheel into it,
    and the folder the wheel was built into (``pip wheel --wheel-dir DIST``)."""
    build = stages(path)[0][1]
    runs = [i.rest for i in build if i.keyword == "RUN"]
    wheel = [re.search(r"pip wheel --no-deps --wheel-dir (\S+) \.(\s|$)", run) for run in runs]
    built = [m[1] for m in wheel if m]
    assert len(built) == 1, "the build stage builds the project's wheel once (pip wheel ...)"
    installs = [(run, _INSTALL.search(run)) for run in runs]
    found = [(run, m) for run, m in installs if m]
    assert len(found) == 1, "one RUN creates the virtualenv and installs the wheel into it"
    ((run, match),) = found
    assert match.start() == 0 and match.end() == len(run.rstrip()), (
        f"the install RUN does that alone (a test runs it): {run}"
    )
    return WheelInstall(run, match["venv"], match["what"], built[0])
