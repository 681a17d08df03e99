"""The wheel as a user gets it, by the README's quickstart: its commands, read from the README
(tests/quickstart.py), run here as written, in a temporary folder outside the checkout. The
install block builds the sdist and the wheel from it once (`make wheel`), creates a new
virtualenv in the user's home and installs the wheel there with its dependencies (`[binary]`
for psycopg's libpq); the blocks after it run the orders example end to end with the installed
`ductor` script and nothing of the checkout on the import path, on a new database (migrate,
topics, register, process, `worker --app`, `start --wait` with the output the README
shows). Also: `ductor --version`, `mypy --strict` on a user's module against the installed
package, the demo, and the tools that need a checkout saying so in one sentence.

And the image's install set, without Docker: the Dockerfile's install instruction (read from
it, tests/dockerfile.py) run as written into a new virtualenv, and what it installed used as
the image uses it (its runtime ENV): psycopg takes its own libpq (`PSYCOPG_IMPL=binary`, so
the machine's libpq, which the image has not, cannot stand in for it), `ductor --help`, and a
processor and the web page against the services.

The user's shell (`Shell`) starts in a folder that stands in for their checkout: it holds what
the quickstart's commands read from one, a copy of examples/ and the `dist/` that `make wheel`
fills. Its HOME is a folder of its own, so `~/ductor-env` is the test's; its caches stay where
they are (XDG_CACHE_HOME), so pip reuses the cache `make venv` filled with the same packages and
downloads nothing the machine has seen. `make` is the one command not run as written (it would
run in the checkout): `make wheel` runs its recipe on the checkout with the output in the
user's folder, and `make up` is the services the suite runs on, which the services plugin
(fix_services.py) checks answer.
tests/unit/test_quickstart.py pins both recipes.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tomllib
import urllib.error
import urllib.request
import uuid
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from email.parser import Parser
from pathlib import Path

import pytest

from processor.io.config.settings import Settings, settings_env
from processor.io.kafka.topics import delete_topics
from processor.io.shipped.files import migrations
from tests import dockerfile
from tests.quickstart import Command, quickstart

from .background_builds import WHEEL
from .samples import REPO
from .scrape import free_port
from .waiting import wait_for

pytestmark = pytest.mark.integration

QUICKSTART = quickstart()
# A user's module, type-checked against the installed package: the public names from the
# package root, the typed decorator (the function keeps its type), the client's results.
USER_MODULE = """\
from __future__ import annotations

from processor import RunStatus, StepContext, StepFailed, StepRegistry, client, load_settings

registry = StepRegistry()


@registry.step("greet")
def greet(ctx: StepContext) -> dict[str, str]:
    if not ctx.input:
        raise StepFailed("nobody to greet")
    return {"hello": str(ctx.input["name"])}


@registry.step("greet_later")
async def greet_later(ctx: StepContext) -> dict[str, str]:
    ctx.heartbeat()
    return greet(ctx)


def finished(run_id: str) -> bool:
    result = client.wait_for_run(load_settings(), run_id, timeout_s=30)
    return result.status is RunStatus.SUCCEEDED
"""
# A step function that does not take a StepContext: an error only if the decorator is typed.
WRONG_MODULE = """\
from processor import StepRegistry

registry = StepRegistry()


@registry.step("count")
def count(n: int) -> int:
    return n + 1
"""


@dataclass(frozen=True)
class UserVenv:
    root: Path  # the temporary folder: the user's home, their checkout's stand-in
    checkout: Path  # the stand-in: examples/ copied, dist/ built by `make wheel`
    venv: Path
    wheel: Path
    env: dict[str, str]  # the user's shell once the quickstart activated the virtualenv

    def bin(self, name: str) -> str:
        return str(self.venv / "bin" / name)


def _run(
    args: list[str],
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 300.0,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, cwd=cwd, env=env, timeout=timeout, capture_output=True, text=True, check=False
    )


def _checked(
    args: list[str], what: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    done = _run(args, cwd=cwd, env=env)
    assert done.returncode == 0, f"{what} failed ({done.returncode}):\n{done.stdout}{done.stderr}"
    return done


class Service:
    """A `ductor` command left running, logging to a file."""

    def __init__(self, args: list[str], cwd: Path, env: dict[str, str]) -> None:
        self.log_path = cwd / f"{Path(args[0]).name}-{args[1]}.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=self._log, stderr=self._log)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(10)
        finally:
            self._log.close()


class Shell:
    """A user's shell, as much of one as the quickstart uses: each command is found on the
    shell's PATH and run as written in its working directory (`~` is its HOME), and must exit
    0; `cd` moves it; `. ACTIVATE` sources the script with bash and keeps what it changed in
    the environment; a trailing `&` leaves the command running (a `Service`). `make` is run
    as the module's docstring says."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self.cwd = cwd
        self.env = dict(env)
        self.services: list[Service] = []
        self.ran: list[tuple[Command, subprocess.CompletedProcess[str]]] = []

    def run(self, commands: Iterable[Command]) -> None:
        for command in commands:
            name, *args = (self._expand(word) for word in command.argv)
            if name == "make":
                self._make(command)
            elif name == "cd":
                (folder,) = args
                self.cwd = (self.cwd / folder).resolve()
                assert self.cwd.is_dir(), f"README.md:{command.line}: {command}: no such folder"
            elif name in (".", "source"):
                (script,) = args
                self._source(self.cwd / script)
            elif command.background:
                self.services.append(
                    Service([self._which(name, command), *args], self.cwd, self.env)
                )
            else:
                done = _run([self._which(name, command), *args], cwd=self.cwd, env=self.env)
                assert done.returncode == 0, (
                    f"README.md:{command.line}: {command} exited {done.returncode}:\n"
                    f"{done.stdout}{done.stderr}"
                )
                self.ran.append((command, done))

    def output_of(self, *words: str) -> subprocess.CompletedProcess[str]:
        """What the command that starts with ``ductor *words`` gave (the only one)."""
        (done,) = [d for c, d in self.ran if c.argv[1 : 1 + len(words)] == words]
        return done

    def stop(self) -> list[int]:
        """The services' exit codes once each had its SIGTERM (`kill %1 %2`)."""
        return [service.stop() for service in self.services]

    def _expand(self, word: str) -> str:
        return self.env["HOME"] + word[1:] if word == "~" or word.startswith("~/") else word

    def _which(self, name: str, command: Command) -> str:
        found = shutil.which(name, path=self.env["PATH"])
        assert found is not None, f"README.md:{command.line}: {name}: command not found"
        return found

    def _make(self, command: Command) -> None:
        if command.argv == ("make", "wheel"):
            built = WHEEL.output()  # its recipe, started with the suite (background_builds.py)
            assert built is not None
            shutil.copytree(built, self.cwd / "dist", dirs_exist_ok=True)
        elif command.argv != ("make", "up"):  # up: the services the suite runs on
            pytest.fail(f"README.md:{command.line}: {command}: not a target the test stands in for")

    def _source(self, script: Path) -> None:
        def variables(shell_code: str) -> dict[str, str]:
            shown = _checked(
                ["bash", "-c", shell_code, "bash", str(script)],
                f"sourcing {script}",
                cwd=self.cwd,
                env=self.env,
            )
            pairs = (item.partition("=") for item in shown.stdout.split("\0") if item)
            return {name: value for name, _, value in pairs if name != "_"}

        before, after = variables("env -0"), variables('. "$1" >/dev/null && env -0')
        for name in before.keys() - after.keys():
            self.env.pop(name, None)
        self.env.update({k: v for k, v in after.items() if before.get(k) != v})


@pytest.fixture(scope="module")
def user_venv(tmp_path_factory: pytest.TempPathFactory) -> UserVenv:
    """The quickstart's install block: the wheel built once and installed, with its
    dependencies, into a new virtualenv in the user's home."""
    if importlib.util.find_spec("build") is None:
        pytest.fail("`python -m build` is missing: install the dev tools (make venv)")
    root = tmp_path_factory.mktemp("wheel-user")
    assert REPO not in root.resolve().parents, "the user's folder must be outside the checkout"
    home, checkout = root / "home", root / "checkout"
    home.mkdir()
    shutil.copytree(
        REPO / "examples",
        checkout / "examples",
        ignore=shutil.ignore_patterns("__pycache__", "*.txt", "*.log"),
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTHON", "DUCTOR_", "VIRTUAL_ENV", "OTEL_"))
    }
    env["XDG_CACHE_HOME"] = env.get("XDG_CACHE_HOME", str(Path.home() / ".cache"))
    env["XDG_CONFIG_HOME"] = env.get("XDG_CONFIG_HOME", str(Path.home() / ".config"))
    env["HOME"] = str(home)
    shell = Shell(checkout, env)
    shell.run(QUICKSTART.install)
    venv = Path(shell.env["VIRTUAL_ENV"])
    assert home in venv.parents, venv
    ductor = shutil.which("ductor", path=shell.env["PATH"])
    assert ductor == str(venv / "bin" / "ductor"), ductor
    (wheel,) = (checkout / "dist").glob("*.whl")
    return UserVenv(root, checkout, venv, wheel, shell.env)


def user_env(user: UserVenv, settings: Settings | None = None) -> dict[str, str]:
    """The environment of the user's shell, their virtualenv active: nothing of the checkout
    and of the tests' own virtualenv; the settings as DUCTOR_* variables."""
    env = dict(user.env)
    if settings is not None:
        env.update(settings_env(replace(settings, log_format="json")))
    return env


def test_the_package_imports_from_the_virtualenv_not_from_the_checkout(user_venv: UserVenv) -> None:
    shown = _checked(
        [user_venv.bin("python"), "-c", "import processor; print(processor.__file__)"],
        "import processor",
        cwd=user_venv.root,
        env=user_env(user_venv),
    )
    where = Path(shown.stdout.strip()).resolve()
    assert user_venv.venv.resolve() in where.parents
    assert REPO not in where.parents


def test_the_installed_wheel_runs_its_compiled_modules_and_its_sources_on_request(
    user_venv: UserVenv,
) -> None:
    """The wheel `make test` builds is the compiled one (setup.py): its core runs compiled,
    without mypy in the user's virtualenv, and DUCTOR_PURE_PYTHON=1 runs the sources. A build
    that fell back to pure Python (no compiler) fails here when the run expects the compiled
    one (DUCTOR_EXPECT_BUILD, set by `make test`)."""
    script = (
        "import processor, processor.core.tick, processor.engine.executor;"
        "print(len(processor.compiled_modules()))"
    )

    def compiled(**extra: str) -> int:
        env = {**user_env(user_venv), **extra}
        done = _checked([user_venv.bin("python"), "-c", script], script, user_venv.root, env)
        return int(done.stdout.strip())

    if os.environ.get("DUCTOR_EXPECT_BUILD") == "compiled":
        assert compiled() > 0, "the wheel carries no compiled module"
    assert compiled(DUCTOR_PURE_PYTHON="1") == 0


def test_the_wheel_holds_the_package_files_and_nothing_of_the_checkout(
    user_venv: UserVenv,
) -> None:
    with zipfile.ZipFile(user_venv.wheel) as wheel:
        names = set(wheel.namelist())
        (metadata_name,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        metadata = Parser().parsestr(wheel.read(metadata_name).decode())
    shipped = {n.removeprefix("processor/schemas/") for n in names if "/schemas/" in n}
    assert shipped == {
        "request.schema.json",
        "wakeup.schema.json",
        "workflow.schema.json",
        "workflows/sample.json",
        *(f"migrations/{m.name}.sql" for m in migrations()),
    }
    assert "processor/py.typed" in names
    # The web page's templates and stylesheet (the ui extra brings the libraries that use them).
    pages = {"base", "dead_letters", "login", "problem", "run", "runs", "schedules"}
    assert {f"processor/ui/templates/{page}.html" for page in pages} <= names
    assert "processor/ui/static/ui.css" in names
    assert {n.split("/")[0] for n in names} == {"processor", metadata_name.split("/")[0]}
    requires = metadata.get_all("Requires-Dist") or []
    assert "psycopg<4,>=3.2" in requires  # without the binary build, as a library should
    assert 'psycopg[binary]<4,>=3.2; extra == "binary"' in requires
    assert {r for r in requires if r.endswith('extra == "ui"')} == {
        'starlette<2,>=1.10; extra == "ui"',
        'jinja2<4,>=3.1.6; extra == "ui"',
        'uvicorn<1,>=0.55; extra == "ui"',
    }
    assert "Typing :: Typed" in (metadata.get_all("Classifier") or [])


def test_ductor_version_is_the_installed_distribution_s(user_venv: UserVenv) -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    shown = _run(
        [user_venv.bin("ductor"), "--version"], cwd=user_venv.root, env=user_env(user_venv)
    )
    assert (shown.returncode, shown.stdout, shown.stderr) == (0, f"ductor {version}\n", "")


def test_mypy_strict_passes_on_a_user_module_against_the_installed_package(
    user_venv: UserVenv,
) -> None:
    """The checkout's mypy, pointed at the virtualenv's interpreter: it finds the package in
    that virtualenv's site-packages, as it would if installed there (PEP 561: py.typed)."""
    work = user_venv.root / "typing"
    work.mkdir()
    (work / "user_steps.py").write_text(USER_MODULE)
    (work / "wrong_steps.py").write_text(WRONG_MODULE)
    checked = _run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--python-executable",
            user_venv.bin("python"),
            "--cache-dir",
            str(work / ".mypy_cache"),
            "user_steps.py",
            "wrong_steps.py",
        ],
        cwd=work,
        env=user_env(user_venv),
    )
    errors = [line for line in checked.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 1, checked.stdout + checked.stderr
    assert errors[0] == (
        'wrong_steps.py:6: error: Value of type variable "StepFunction" of function cannot be'
        ' "Callable[[int], int]"  [type-var]'
    )
    assert "Found 1 error in 1 file (checked 2 source files)" in checked.stdout


def test_the_tools_that_need_a_checkout_say_so_in_one_sentence(user_venv: UserVenv) -> None:
    env = user_env(user_venv)
    chaos = _run(
        [user_venv.bin("python"), "-m", "processor.tools.chaos"], cwd=user_venv.root, env=env
    )
    assert chaos.returncode == 2
    assert chaos.stderr.count("\n") == 1, chaos.stderr
    assert chaos.stderr.startswith("chaos: the chaos run restarts the services, and the local")
    assert "Traceback" not in chaos.stdout + chaos.stderr

    silent = replace(Settings(), pg_dsn="postgresql://ductor:ductor@127.0.0.1:9/ductor")
    demo = _run(
        [user_venv.bin("ductor"), "demo"], cwd=user_venv.root, env=user_env(user_venv, silent)
    )
    assert (demo.returncode, demo.stdout) == (1, ""), demo.stderr
    assert demo.stderr.count("\n") == 1, demo.stderr
    assert demo.stderr.startswith(
        f"ductor: Postgres at {silent.pg_dsn_redacted} does not answer: start it, or point"
    ), demo.stderr

    bench = _run([user_venv.bin("ductor"), "bench", "--help"], cwd=user_venv.root, env=env)
    assert bench.returncode == 0, bench.stderr
    assert bench.stdout.startswith("usage: ductor bench")


def test_the_web_page_without_its_extra_says_how_to_install_it(user_venv: UserVenv) -> None:
    """The quickstart installs `[binary]` only: `ductor ui` names the extra to install, in one
    sentence, exit 2."""
    shown = _run([user_venv.bin("ductor"), "ui"], cwd=user_venv.root, env=user_env(user_venv))
    assert (shown.returncode, shown.stdout) == (2, ""), shown.stderr
    assert shown.stderr.startswith("ductor: ductor ui needs the ui extra ("), shown.stderr
    assert shown.stderr.endswith(": pip install 'ductor-processor[ui]'\n"), shown.stderr


@pytest.fixture
def wheel_settings(base_settings: Settings, scratch_dsn: str) -> Iterator[Settings]:
    """Settings of a user who has never run Ductor: a new, empty database, topics of their
    own (created by the test through `ductor topics create`, deleted after)."""
    tag = uuid.uuid4().hex[:8]
    settings = replace(
        base_settings,
        pg_dsn=scratch_dsn,
        topic_prefix=f"wheel-{tag}",
        group_id=f"wheel-{tag}",
        wakeup_partitions=2,
        delay_partitions=2,
        step_partitions=2,
    )
    yield settings
    delete_topics(settings)


def test_the_readme_quickstart_runs_from_the_installed_wheel(
    user_venv: UserVenv, wheel_settings: Settings
) -> None:
    """The quickstart's blocks after the install, as written: the services, the tables and
    topics, the example's workflow registered, a coordinator and a worker left running, a run
    started and its result awaited. The user's services are the suite's, with a new database
    and topics of their own (DUCTOR_* variables, as the quickstart says for yours)."""
    shell = Shell(user_venv.checkout, user_env(user_venv, wheel_settings))
    try:
        shell.run(QUICKSTART.rest)
        for service in shell.services:
            assert service.proc.poll() is None, service.log_path.read_text()[-2000:]
    finally:
        codes = shell.stop()
    assert codes == [0, 0], [s.log_path.read_text()[-2000:] for s in shell.services]
    assert shell.cwd == user_venv.checkout / "examples" / "orders"
    assert [c.argv[1] for c in QUICKSTART.rest if c.background] == ["process", "worker"]

    expected = "applied: " + ", ".join(m.name for m in migrations()) + "\n"
    assert shell.output_of("migrate").stdout == expected
    assert f"{wheel_settings.topic_prefix}.steps" in shell.output_of("topics", "create").stdout
    registered = shell.output_of("workflows", "register")
    assert registered.stdout == "workflow orders v1 registered\n"
    shown = shell.output_of("start")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == QUICKSTART.output
    # The worker started a moment before may not be registered yet: then `start` warns that
    # no live worker serves the steps (they wait for one; it comes).
    *warnings, said = shown.stderr.splitlines()
    assert said == "run order-1001 started; waiting for its end", shown.stderr
    assert all(w.startswith("warning: workflow orders v1: no live worker") for w in warnings), (
        shown.stderr
    )


def test_the_demo_runs_from_the_installed_wheel(
    user_venv: UserVenv, wheel_settings: Settings
) -> None:
    """`ductor demo` against services that answer: it needs nothing of the checkout (its
    sample workflow comes from the package, its logs go to a temporary directory)."""
    env = {**user_env(user_venv, wheel_settings), "TMPDIR": str(user_venv.root)}
    demo = _run(
        [user_venv.bin("ductor"), "demo", "--runs", "50", "--timeout", "120"],
        cwd=user_venv.root,
        env=env,
    )
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "Every run ended as expected." in demo.stdout
    (logs,) = [line for line in demo.stdout.splitlines() if line.startswith("Logs: ")]
    assert logs.startswith(f"Logs: {user_venv.root}/ductor-demo-"), logs


@dataclass(frozen=True)
class ImageVenv:
    venv: Path  # the image's /opt/ductor
    env: dict[str, str]  # the image's runtime ENV, its paths made this folder's

    def bin(self, name: str) -> str:
        return str(self.venv / "bin" / name)


@pytest.fixture(scope="module")
def image_venv(tmp_path_factory: pytest.TempPathFactory) -> ImageVenv:
    """The Dockerfile's install instruction, as written but for its two folders: the wheel's
    (the one `make wheel` built, as the build stage's `pip wheel` does) and the virtualenv's,
    with `python` the interpreter of the tests."""
    built = WHEEL.output()
    assert built is not None
    root = tmp_path_factory.mktemp("image")
    install = dockerfile.wheel_install()
    venv = root / "opt-ductor"
    command = install.command.replace(install.venv, str(venv))
    command = command.replace(f"{install.dist}/", f"{built}/")
    tools = root / "bin"
    tools.mkdir()
    (tools / "python").symlink_to(sys.executable)
    here = Path(sys.executable).parent
    path = [p for p in os.environ["PATH"].split(os.pathsep) if Path(p) != here]
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTHON", "DUCTOR_", "VIRTUAL_ENV", "OTEL_", "PSYCOPG"))
    }
    base["PATH"] = os.pathsep.join(path)
    _checked(
        ["sh", "-c", command],
        f"the image's install ({command})",
        cwd=root,
        env={**base, "PATH": os.pathsep.join([str(tools), *path])},
    )
    runtime = {
        name: value.replace(install.venv, str(venv)).replace("$PATH", base["PATH"])
        for name, value in dockerfile.runtime_env().items()
    }
    # Whatever the Dockerfile says: psycopg's own build, or an ImportError.
    return ImageVenv(venv, {**base, **runtime, "PSYCOPG_IMPL": "binary"})


def test_the_images_install_set_brings_its_own_libpq(image_venv: ImageVenv) -> None:
    """The image's base has no libpq: psycopg must run on the build its `binary` extra brings
    (the machine running this test has a libpq, which PSYCOPG_IMPL=binary keeps out)."""
    env = image_venv.env
    assert shutil.which("ductor", path=env["PATH"]) == image_venv.bin("ductor")
    shown = _checked(
        [image_venv.bin("python"), "-c", "import psycopg; print(psycopg.pq.__impl__)"],
        "import psycopg",
        env=env,
    )
    assert shown.stdout == "binary\n"
    helped = _run([image_venv.bin("ductor"), "--help"], env=env)
    assert (helped.returncode, helped.stderr) == (0, ""), helped.stderr
    assert helped.stdout.startswith("usage: ductor")


def _status(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as refused:
        return int(refused.code)
    except OSError:
        return 0


def test_the_images_processor_and_web_page_run_against_the_services(
    image_venv: ImageVenv, wheel_settings: Settings, tmp_path: Path
) -> None:
    """What the image's pods run, from its install set: the schema and topics made, a
    processor ready (its partitions assigned, Postgres answering: /readyz), the web page
    serving its pages from Postgres; both stop cleanly on SIGTERM."""
    health, page = free_port(), free_port()
    settings = replace(wheel_settings, health_port=health, log_format="json")
    env = {**image_venv.env, **settings_env(settings)}
    for command in (["migrate"], ["topics", "create"]):
        done = _checked([image_venv.bin("ductor"), *command], f"ductor {command[0]}", env=env)
        assert "Traceback" not in done.stdout + done.stderr
    services = [
        Service([image_venv.bin("ductor"), "process"], tmp_path, env),
        Service([image_venv.bin("ductor"), "ui", "--port", str(page)], tmp_path, env),
    ]
    try:
        wait_for(lambda: _status(health, "/readyz") == 200, 90, "the processor to be ready")
        wait_for(lambda: _status(page, "/static/ui.css") == 200, 60, "the web page to serve")
        assert _status(page, "/") == 200, "the runs page reads Postgres"
        assert _status(page, "/schedules") == 200
    finally:
        codes = [service.stop() for service in services]
    assert codes == [0, 0], [s.log_path.read_text()[-2000:] for s in services]
