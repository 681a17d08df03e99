"""The wheel as a user gets it. Built once from this checkout (`python -m build`: the sdist,
then the wheel from the sdist), installed with its dependencies (`[binary]` for psycopg's
libpq) by pip into a new virtualenv in a temporary folder outside the checkout, and used from
there as a user would, with the installed `ductor` script and nothing of the checkout on the
import path: the orders example end to end on a new database (migrate, topics, register,
process, `worker --app`, start, `result --wait` with the exact output), `ductor --version`,
`mypy --strict` on a user's module against the installed package, and the tools that need a
checkout saying so in one sentence.

pip reuses its cache (~/.cache/pip: `make venv` filled it with the same packages), so the
install downloads nothing the machine has seen.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tomllib
import uuid
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from email.parser import Parser
from pathlib import Path

import orjson
import pytest

from processor.io.config import Settings, settings_env
from processor.io.package_files import migrations
from processor.io.topics import delete_topics

from .conftest import REPO

pytestmark = pytest.mark.integration

EXAMPLE = REPO / "examples" / "orders"
ADA = {
    "order_id": "1001",
    "customer": "ada@example.com",
    "country": "DE",
    "items": [
        {"sku": "book", "qty": 2, "unit_cents": 1250},
        {"sku": "mug", "qty": 1, "unit_cents": 899},
    ],
}
# Exactly what examples/orders/README.md shows (jsonb orders the keys).
ADA_RESULT = (
    '{"charges":{"tax_cents":740,"total_cents":4634,"shipping_cents":495,"subtotal_cents":3399},'
    '"confirmation":{"message":"order 1001: 3 item(s), 46.34 EUR, confirmed",'
    '"customer":"ada@example.com","order_id":"1001","reservation":"res-order-1001"}}\n'
)
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
    root: Path  # the temporary folder: the venv, the built files, the user's own files
    venv: Path
    wheel: Path

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


@pytest.fixture(scope="module")
def user_venv(tmp_path_factory: pytest.TempPathFactory) -> UserVenv:
    """The wheel built once and installed, with its dependencies, into a new virtualenv."""
    if importlib.util.find_spec("build") is None:
        pytest.fail("`python -m build` is missing: install the dev tools (make venv)")
    root = tmp_path_factory.mktemp("wheel-user")
    assert REPO not in root.resolve().parents, "the user's folder must be outside the checkout"
    dist = root / "dist"
    _checked([sys.executable, "-m", "build", "--outdir", str(dist), str(REPO)], "the build")
    (wheel,) = dist.glob("*.whl")
    venv = root / "venv"
    _checked([sys.executable, "-m", "venv", str(venv)], "creating the virtualenv")
    _checked(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", f"{wheel}[binary]"],
        "pip install of the wheel",
        cwd=root,
    )
    return UserVenv(root, venv, wheel)


def user_env(user: UserVenv, settings: Settings | None = None) -> dict[str, str]:
    """The environment of a user whose virtualenv is active: nothing of the checkout and of
    the tests' own virtualenv, the settings as DUCTOR_* variables."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTHON", "DUCTOR_", "VIRTUAL_ENV", "OTEL_"))
    }
    env["PATH"] = f"{user.venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(user.venv)
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


def test_the_wheel_holds_the_package_files_and_nothing_of_the_checkout(
    user_venv: UserVenv,
) -> None:
    with zipfile.ZipFile(user_venv.wheel) as wheel:
        names = set(wheel.namelist())
        (metadata_name,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        metadata = Parser().parsestr(wheel.read(metadata_name).decode())
    shipped = {n.removeprefix("processor/schemas/") for n in names if "/schemas/" in n}
    assert shipped == {
        "wakeup.schema.json",
        "workflow.schema.json",
        "workflows/sample.json",
        *(f"migrations/{m.name}.sql" for m in migrations()),
    }
    assert "processor/py.typed" in names
    assert {n.split("/")[0] for n in names} == {"processor", metadata_name.split("/")[0]}
    requires = metadata.get_all("Requires-Dist") or []
    assert "psycopg<4,>=3.2" in requires  # without the binary build, as a library should
    assert 'psycopg[binary]<4,>=3.2; extra == "binary"' in requires
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


def test_the_orders_example_runs_from_the_installed_wheel(
    user_venv: UserVenv, wheel_settings: Settings
) -> None:
    """examples/orders copied beside the user, as their own steps would be, and run with the
    commands of its README, from the installed `ductor` script only."""
    orders = user_venv.root / "orders"
    shutil.copytree(EXAMPLE, orders, ignore=shutil.ignore_patterns("__pycache__", "*.txt"))
    env = user_env(user_venv, wheel_settings)
    ductor = user_venv.bin("ductor")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return _run([ductor, *args], cwd=orders, env=env, timeout=120)

    migrated = run("migrate")
    expected = "applied: " + ", ".join(m.name for m in migrations()) + "\n"
    assert (migrated.returncode, migrated.stdout) == (0, expected), migrated.stderr
    topics = run("topics", "create")
    assert topics.returncode == 0, topics.stderr
    assert f"{wheel_settings.topic_prefix}.steps" in topics.stdout
    registered = run("workflows", "register", "workflow.json")
    assert (registered.returncode, registered.stdout) == (0, "workflow orders v1 registered\n")

    services = [
        Service([ductor, "process"], orders, env),
        Service([ductor, "worker", "--app", "steps:registry"], orders, env),
    ]
    try:
        started = run(
            "start", "orders", "--run-id", "order-1001", "--input", orjson.dumps(ADA).decode()
        )
        assert (started.returncode, started.stdout) == (0, "order-1001\n"), started.stderr
        shown = run("result", "order-1001", "--wait", "60")
        assert (shown.returncode, shown.stdout, shown.stderr) == (0, ADA_RESULT, "")
        for service in services:
            assert service.proc.poll() is None, service.log_path.read_text()[-2000:]
    finally:
        codes = [service.stop() for service in services]
    assert codes == [0, 0], [s.log_path.read_text()[-2000:] for s in services]


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
