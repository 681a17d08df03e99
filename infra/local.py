"""Run ductor's development infrastructure on this machine: Kafka and PostgreSQL, no Docker.

    .venv/bin/python infra/local.py up|down|status [kafka|postgres]
    .venv/bin/python infra/local.py restart [kafka|postgres] [--mode fast|immediate|kill]
                                            [--down-for SECONDS]
    .venv/bin/python infra/local.py kill [kafka|postgres]
    .venv/bin/python infra/local.py restart|kill kafka --node N    (one node of a cluster)

Kafka 4.1.1 (KRaft: one combined broker/controller node, or a cluster of them) runs from
Maven Central jars with the system JDK; PostgreSQL runs as a private cluster of the Debian
server packages, beside (never instead of) any cluster the machine already has. Both listen
on 127.0.0.1 only. Missing JDK, Maven or PostgreSQL packages are installed with apt-get when
running as root.

The broker has two client listeners: PLAINTEXT (what everything uses by default) and
SASL_PLAINTEXT with SCRAM-SHA-512, for testing authenticated clients. The SCRAM credentials
(user `ductor`, password `ductor-scram-secret`: a development secret, like the Postgres
password) are written into the cluster metadata when `up` formats the log dir
(`kafka-storage format --add-scram`), so they exist before the broker first answers. The
broker runs the KRaft ACL authorizer, for trying and testing ACL recipes: a new principal may
do only what its ACLs allow, and the ones everything else uses (ANONYMOUS on the PLAINTEXT
listener, `ductor` on the SASL one) are super users.

`up` starts Kafka on a freshly formatted log dir every time (a new, empty cluster); Postgres
keeps its data directory. `restart` stops a service and starts it again on its data, keeping
Kafka's topics, records and committed offsets too: `--mode fast` (default) shuts it down
cleanly, `immediate` is `pg_ctl stop -m immediate` (crash recovery at the next start; for
Kafka, which has no such mode, a SIGKILL), `kill` sends SIGKILL to the server and every
process of its group; `--down-for` keeps it stopped that long first (an outage of chosen
length). `kill` crashes a service with SIGKILL and leaves it stopped, its data kept; `restart`
brings it back on that data. Both are for outage and chaos tests, which call the same
methods (`Kafka.restart`, `Postgres.down(StopMode.KILL)`...: tests/integration/restarts.py).

Environment:
    DUCTOR_INFRA_DIR                    state directory (default: <repo>/.infra)
    DUCTOR_LOCAL_KAFKA_PORT             broker port (default 19092)
    DUCTOR_LOCAL_KAFKA_CONTROLLER_PORT  KRaft controller port (default 19093)
    DUCTOR_LOCAL_KAFKA_SASL_PORT        SASL_PLAINTEXT (SCRAM-SHA-512) listener port (default 19094)
    DUCTOR_LOCAL_KAFKA_BROKERS          brokers (default 1); 3 runs a cluster of combined
                                        broker/controller nodes, node N on the ports above
                                        plus 3*(N-1), topics replicated 3 times (min ISR 2)
    DUCTOR_LOCAL_PG_PORT                PostgreSQL port (default 55432)
    DUCTOR_INFRA=docker                 use infra/compose.yaml instead (needs a Docker engine)

`status` exits 0 when every service asked about is running, 3 otherwise.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import enum
import hashlib
import os
import pwd
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import psycopg
from confluent_kafka import KafkaException
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
KAFKA_POM = REPO_ROOT / "infra" / "kafka-pom.xml"
COMPOSE_FILE = REPO_ROOT / "infra" / "compose.yaml"

HOST = "127.0.0.1"
KAFKA_VERSION = "4.1.1"
MIN_JAVA = 17
KAFKA_READY_SECONDS = 90.0
KAFKA_STOP_GRACE_SECONDS = 20.0
# What `logs` shows of the broker's server.log: warnings and worse, starts and stops.
KAFKA_NOTABLE_LINE = re.compile(
    r"\] (WARN|ERROR|FATAL) |Kafka Server started|BrokerServer id=\d+\] shutting down"
)
# How long the SASL listener may refuse the SCRAM user once the plaintext one answers, before
# the user is written again (Kafka.write_scram_user).
SCRAM_GRACE_S = 5.0
KAFKA_RESTART_LAUNCHES = 2  # launches of a broker on its data before `restart` gives up
PG_READY_SECONDS = 60.0
PG_USER = PG_PASSWORD = PG_DATABASE = "ductor"
# The SASL listener's one SCRAM user (development credentials, like the Postgres ones).
KAFKA_SASL_MECHANISM = "SCRAM-SHA-512"
KAFKA_SASL_USER = "ductor"
KAFKA_SASL_PASSWORD = "ductor-scram-secret"
SERVICES = ("kafka", "postgres")
EXIT_NOT_RUNNING = 3


class InfraError(Exception):
    """A failure the user can act on; main() prints the message without a traceback."""


# --------------------------------------------------------------------------- configuration


@dataclass(frozen=True)
class Settings:
    infra_dir: Path
    kafka_port: int
    controller_port: int
    sasl_port: int
    pg_port: int
    kafka_brokers: int = 1

    @classmethod
    def from_env(cls) -> Settings:
        infra_dir = Path(os.environ.get("DUCTOR_INFRA_DIR") or REPO_ROOT / ".infra")
        return cls(
            # Absolute and resolved: paths end up in config files, pid checks and /proc lookups.
            infra_dir=infra_dir.expanduser().resolve(),
            kafka_port=_port_from_env("DUCTOR_LOCAL_KAFKA_PORT", 19092),
            controller_port=_port_from_env("DUCTOR_LOCAL_KAFKA_CONTROLLER_PORT", 19093),
            sasl_port=_port_from_env("DUCTOR_LOCAL_KAFKA_SASL_PORT", 19094),
            pg_port=_port_from_env("DUCTOR_LOCAL_PG_PORT", 55432),
            kafka_brokers=_brokers_from_env(),
        )


MAX_BROKERS = 5


def _brokers_from_env() -> int:
    raw = os.environ.get("DUCTOR_LOCAL_KAFKA_BROKERS", "").strip()
    if not raw:
        return 1
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_BROKERS:
        raise InfraError(
            f"DUCTOR_LOCAL_KAFKA_BROKERS={raw!r}: a number of brokers from 1 to {MAX_BROKERS}"
        )
    return int(raw)


def _port_from_env(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise InfraError(f"{name}={raw!r} is not a TCP port (1-65535)")
    return int(raw)


# --------------------------------------------------------------------------- service state


class State(enum.Enum):
    RUNNING = "running"
    STOPPED = "stopped"
    NOT_ANSWERING = "NOT ANSWERING"
    DEAD = "DEAD"


@dataclass(frozen=True)
class Status:
    state: State
    pid: int | None = None
    detail: str = ""

    def describe(self, endpoint: str) -> str:
        if self.state is State.RUNNING:
            return f"running  {endpoint} (pid {self.pid})"
        if self.state is State.NOT_ANSWERING:
            return f"NOT ANSWERING (pid {self.pid} alive but {self.detail})"
        if self.state is State.DEAD:
            return f"DEAD (pid file but process gone: pid {self.pid})"
        return f"stopped{f' ({self.detail})' if self.detail else ''}"


class StopMode(enum.Enum):
    """How `restart` and `kill` stop a service. Every mode keeps the service's data."""

    FAST = "fast"  # kafka: controlled shutdown (SIGTERM); postgres: pg_ctl stop -m fast
    IMMEDIATE = "immediate"  # kafka: SIGKILL; postgres: pg_ctl stop -m immediate (no checkpoint)
    KILL = "kill"  # SIGKILL to the server and every process of its group: a crash


def note(message: str) -> None:
    """Progress goes to stderr so stdout carries only the summary and the env vars."""
    print(message, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- processes, ports


def read_pid(path: Path) -> int | None:
    try:
        text = path.read_text().split("\n", 1)[0].strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def process_alive(pid: int, marker: str) -> bool:
    """True if pid is a live process whose command line contains marker.

    The marker guards against pid reuse after a crash. A zombie counts as gone: os.kill(pid, 0)
    would still succeed for it, and nobody may reap a broker killed with -9 (pid 1 here is not
    necessarily an init that reaps).
    """
    try:
        proc_stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return False
    state = proc_stat.rsplit(")", 1)[-1].split()[0]
    return state not in ("Z", "X") and marker.encode() in cmdline


def wait_gone(pid: int, marker: str, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while process_alive(pid, marker):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):  # the whole group is already gone
        os.killpg(pgid, sig)


def leftover_pids(cwd: Path, exe_name: str) -> list[int]:
    """Processes of ours that outlived their leader: same working directory, same executable.

    Both checks are needed: the cwd alone would also match a shell someone opened in the dir.
    """
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            same_cwd = Path(os.readlink(entry / "cwd")) == cwd
            same_exe = Path(os.readlink(entry / "exe")).name == exe_name
        except OSError:
            continue
        if same_cwd and same_exe:
            found.append(int(entry.name))
    return found


def kill_leftovers(cwd: Path, exe_name: str) -> None:
    pids = leftover_pids(cwd, exe_name)
    for pid in pids:
        note(f"  killing leftover {exe_name} process {pid}")
        os.kill(pid, signal.SIGKILL)
    for pid in pids:
        wait_gone(pid, marker="", seconds=5)  # any command line: the pid is known to be ours


def tcp_open(port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=timeout):
            return True
    except OSError:
        return False


def port_free(port: int) -> bool:
    """Whether we could listen on HOST:port. SO_REUSEADDR so TIME_WAIT leftovers don't count."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


# A JVM killed with SIGKILL: its main thread is a zombie at once, its other threads (and the
# sockets they hold) go a moment later.
PORT_RELEASE_GRACE_S = 15.0


def require_free_port(port: int, variable: str, service: str, grace_s: float = 0.0) -> None:
    """Fail unless the port is free, waiting up to ``grace_s`` for it (a process we killed
    can release its sockets a moment after its main thread is reported gone)."""
    deadline = time.monotonic() + grace_s
    while not port_free(port) and time.monotonic() < deadline:
        time.sleep(0.1)
    if not port_free(port):
        raise InfraError(
            f"{HOST}:{port} is already in use by another process (not our {service}); "
            f"set {variable} to a free port and try again"
        )


def port_note(port: int) -> str:
    return "" if port_free(port) else f"but {HOST}:{port} is taken by another process"


def tail(path: Path, lines: int = 25, only: re.Pattern[str] | None = None) -> str:
    """The last ``lines`` lines of ``path`` (of those ``only`` matches: a log's warnings,
    errors, starts and stops), headed by its name."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    picked = [line for line in text if only is None or only.search(line)][-lines:]
    what = "last lines" if only is None else "last warnings, errors, starts and stops"
    return f"--- {what} of {path} ---\n" + "\n".join(picked) if picked else ""


def run_checked(cmd: Sequence[str | Path], what: str, cwd: Path | None = None) -> str:
    """Run a short command; on failure raise with its output, which names the actual problem."""
    done = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise InfraError(f"{what} failed (exit {done.returncode}):\n{done.stdout}{done.stderr}")
    return done.stdout


# --------------------------------------------------------------------------- apt packages


def apt_install(packages: list[str], why: str) -> None:
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise InfraError(f"{why}. Install {' '.join(packages)} (as root) and try again.")
    note(f"{why}: installing {' '.join(packages)} with apt-get (this takes a while)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", *packages]):
        # apt's own output goes to stderr: it is progress, and it explains any failure.
        if subprocess.run(cmd, env=env, stdout=sys.stderr, check=False).returncode != 0:
            raise InfraError(f"`{' '.join(cmd)}` failed; see its output above")


# --------------------------------------------------------------------------- Kafka


def java_major(java: Path) -> int:
    """Major version of a java binary (0 if it does not run). "1.8.0" style means 8."""
    try:
        out = subprocess.run(
            [str(java), "-version"], capture_output=True, text=True, check=False, timeout=60
        ).stderr
    except (OSError, subprocess.TimeoutExpired):
        return 0
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    if match is None:
        return 0
    major = int(match[1])
    return int(match[2] or 0) if major == 1 else major


def find_java() -> Path | None:
    candidates = []
    if os.environ.get("JAVA_HOME"):
        candidates.append(Path(os.environ["JAVA_HOME"]) / "bin" / "java")
    if on_path := shutil.which("java"):
        candidates.append(Path(on_path))
    # A default `java` older than 17 may coexist with an installed 17+ JDK.
    candidates += sorted(Path("/usr/lib/jvm").glob("*/bin/java"), reverse=True)
    return next((c for c in candidates if java_major(c) >= MIN_JAVA), None)


def ensure_java(need_maven: bool) -> Path:
    """A java 17+ (and mvn when jars must be downloaded), installed with apt if missing."""
    java = find_java()
    missing = [] if java else [f"java {MIN_JAVA}+"]
    if need_maven and not shutil.which("mvn"):
        missing.append("mvn")
    if java and not missing:
        return java
    apt_install(["maven", "openjdk-17-jdk-headless"], f"{' and '.join(missing)} not found")
    java = find_java()
    if java is None or (need_maven and not shutil.which("mvn")):
        raise InfraError(f"still no java {MIN_JAVA}+ / mvn after apt-get install")
    return java


class Kafka:
    """One broker: the only one (``settings.kafka_brokers`` 1, its state in ``kafka/``), or
    node ``node`` of a cluster (``kafka-node<N>/``, its ports the first node's plus 3 per node
    before it: 19092-19094, 19095-19097, 19098-19100 by default)."""

    name = "kafka"

    def __init__(self, settings: Settings, node: int = 1) -> None:
        self.settings = settings
        self.node = node
        self.in_cluster = settings.kafka_brokers > 1
        self.label = f"kafka node {node}" if self.in_cluster else "kafka"
        shift = 3 * (node - 1)
        self.port = settings.kafka_port + shift
        self.controller_port = settings.controller_port + shift
        self.sasl_port = settings.sasl_port + shift
        self.home = settings.infra_dir / f"kafka-{KAFKA_VERSION}"
        self.lib = self.home / "lib"
        self.stamp = self.home / "installed.stamp"
        # Runtime state lives outside the install dir, so wiping the install never orphans a pid.
        self.run_dir = settings.infra_dir / (f"kafka-node{node}" if self.in_cluster else "kafka")
        self.pid_file = self.run_dir / "kafka.pid"
        self.props_file = self.run_dir / "server.properties"
        self.log4j_file = self.run_dir / "log4j2.properties"
        self.out_file = self.run_dir / "kafka.out"
        self.log_dir = self.run_dir / "logs"
        self.data_dir = self.run_dir / "data"

    @property
    def endpoint(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def sasl_endpoint(self) -> str:
        return f"{HOST}:{self.sasl_port}"

    def env(self) -> dict[str, str]:
        return {"DUCTOR_BOOTSTRAP_SERVERS": self.endpoint}

    def sasl_env(self) -> dict[str, str]:
        """The settings of a ductor client that goes through the SASL listener instead."""
        return {
            "DUCTOR_BOOTSTRAP_SERVERS": self.sasl_endpoint,
            "DUCTOR_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
            "DUCTOR_KAFKA_SASL_MECHANISM": KAFKA_SASL_MECHANISM,
            "DUCTOR_KAFKA_SASL_USERNAME": KAFKA_SASL_USER,
            "DUCTOR_KAFKA_SASL_PASSWORD": KAFKA_SASL_PASSWORD,
        }

    def sasl_client_config(
        self, password: str = KAFKA_SASL_PASSWORD
    ) -> dict[str, str | int | float | bool]:
        """librdkafka properties of a client of the SASL listener."""
        return {
            "bootstrap.servers": self.sasl_endpoint,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": KAFKA_SASL_MECHANISM,
            "sasl.username": KAFKA_SASL_USER,
            "sasl.password": password,
        }

    def configuration_is_current(self) -> bool:
        """Whether the running broker was started with the properties this script writes now
        (False e.g. for a broker started before the SASL listener existed)."""
        try:
            return self.props_file.read_text() == self.server_properties()
        except OSError:
            return False

    # The props file path is unique to this infra dir: it identifies *our* JVM in /proc.
    @property
    def marker(self) -> str:
        return str(self.props_file)

    def status(self) -> Status:
        pid = read_pid(self.pid_file)
        if pid is None:
            return Status(State.STOPPED, detail=port_note(self.port))
        if not process_alive(pid, self.marker):
            return Status(State.DEAD, pid)
        problem = self.probe(timeout=5.0)
        return Status(State.NOT_ANSWERING, pid, problem) if problem else Status(State.RUNNING, pid)

    def probe(self, timeout: float) -> str | None:
        """None if the broker answers a metadata request, else what is wrong."""
        if not tcp_open(self.port):
            return f"nothing accepts connections on {self.endpoint}"
        admin = AdminClient({"bootstrap.servers": self.endpoint})
        try:
            admin.list_topics(timeout=timeout)
        except KafkaException as exc:
            return f"no metadata response: {exc}"
        return None

    def probe_sasl(self, timeout: float) -> str | None:
        """None if the SASL listener authenticates our SCRAM user and answers a metadata
        request with it, else what is wrong."""
        if not tcp_open(self.sasl_port):
            return f"nothing accepts connections on {self.sasl_endpoint} (the SASL listener)"
        admin = AdminClient(self.sasl_client_config())
        try:
            admin.list_topics(timeout=timeout)
        except KafkaException as exc:
            return f"no metadata response through the SASL listener: {exc}"
        return None

    def up(self) -> None:
        current = self.status()
        if current.state is State.RUNNING:
            note(f"{self.label}: already running and answering (pid {current.pid}); nothing to do")
            if not self.configuration_is_current():
                note(
                    "kafka: but it was started with other settings than this script writes now"
                    " (e.g. before the SASL listener existed); `infra/local.py down kafka` and"
                    " `up kafka` start a new broker with them"
                )
            return
        if current.state is not State.STOPPED:
            note(f"{self.label}: {current.describe(self.endpoint)}; starting it afresh")
            self.down()
        java = self.prepare()
        started = time.monotonic()
        self.write_config()
        self.format_storage(java)
        self.launch_and_wait(java)
        note(f"{self.label}: started in {time.monotonic() - started:.1f} s")

    def restart(self, mode: StopMode = StopMode.FAST, down_for_s: float = 0.0) -> None:
        """Stop the broker by ``mode`` and start it again on the same log dir: topics, records,
        committed offsets and groups survive, as after a real broker restart (unlike `up`,
        which formats a new cluster). A broker that is not running is started on its data."""
        self.down(mode)
        wait_down(self.name, down_for_s)
        started = time.monotonic()
        self.check_restartable()
        failures: list[str] = []
        # A second launch, as a supervisor's restart-on-failure would: a broker that dies or
        # hangs while starting on its data is killed, and the next launch finds its ports and
        # its log dir's lock free. Both failures are in the error if that one fails too.
        for launch in range(1, KAFKA_RESTART_LAUNCHES + 1):
            try:
                self.launch_and_wait(self.prepare(grace_s=PORT_RELEASE_GRACE_S))
                break
            except InfraError as exc:
                failures.append(f"launch {launch}: {exc}")
                kill_leftovers(self.run_dir, "java")
                if launch == KAFKA_RESTART_LAUNCHES:
                    raise InfraError(
                        f"{self.label} did not start on its data in {launch} launches\n"
                        + "\n".join(failures)
                    ) from exc
                note(f"{self.label}: {str(exc).splitlines()[0]}; launching it again")
        note(f"{self.label}: started on its data in {time.monotonic() - started:.1f} s")

    def start_afresh(self) -> Path:
        """A new empty broker (`up`) in place of one that will not start on its data: the old
        log dir and logs are moved to ``failed/`` (the previous ones there replaced), for
        whoever finds out why. Returns that directory."""
        self.down(StopMode.KILL)
        kept = self.run_dir / "failed"
        shutil.rmtree(kept, ignore_errors=True)
        kept.mkdir(parents=True)
        for path in (self.data_dir, self.log_dir, self.out_file):
            if path.exists():
                path.rename(kept / path.name)
        self.up()
        return kept

    def check_restartable(self) -> None:
        """A formatted log dir whose properties are the ones this script writes now."""
        if not (self.data_dir / "meta.properties").is_file() or not self.props_file.is_file():
            raise InfraError(
                f"{self.label}: no formatted log dir in {self.data_dir} to restart on;"
                " run `up` first"
            )
        # The controller's host, port and directory id were baked in when `up` formatted the
        # log dir: a broker on other ports would not find its own quorum.
        if self.props_file.read_text() != self.server_properties():
            raise InfraError(
                f"{self.label}: {self.data_dir} was formatted with other ports or paths than the "
                "current settings; restore them, or run `down` and `up` for a fresh broker"
            )
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.log4j_file.write_text(LOG4J2_PROPERTIES)

    def prepare(self, grace_s: float = 0.0) -> Path:
        """A java to run the broker with, the jars installed, and the broker's ports free
        (waiting up to ``grace_s`` for them after a stop)."""
        java = ensure_java(need_maven=not self.installed())
        self.install(java)
        for port, variable in (
            (self.port, "DUCTOR_LOCAL_KAFKA_PORT"),
            (self.controller_port, "DUCTOR_LOCAL_KAFKA_CONTROLLER_PORT"),
            (self.sasl_port, "DUCTOR_LOCAL_KAFKA_SASL_PORT"),
        ):
            require_free_port(port, variable, "kafka broker", grace_s)
        return java

    def launch_and_wait(self, java: Path) -> None:
        self.wait_launched(self.launch(java))

    def wait_launched(self, proc: subprocess.Popen[bytes]) -> None:
        try:
            self.wait_ready(proc)
        except BaseException:
            self.stop_pid(proc.pid)
            proc.wait()
            self.pid_file.unlink(missing_ok=True)  # the logs stay, for the error message
            raise

    def installed(self) -> bool:
        return (
            self.stamp.is_file()
            and self.stamp.read_text().strip() == self.pom_digest()
            and any(self.lib.glob("kafka_2.13-*.jar"))
        )

    def pom_digest(self) -> str:
        # The stamp records which POM filled lib/, so editing the pins triggers a reinstall.
        return hashlib.sha256(KAFKA_POM.read_bytes()).hexdigest()

    def install(self, java: Path) -> None:
        if self.installed():
            return
        note(f"{self.label}: downloading Kafka {KAFKA_VERSION} jars with Maven into {self.lib}")
        started = time.monotonic()
        partial = self.home / "lib.partial"
        shutil.rmtree(partial, ignore_errors=True)
        shutil.rmtree(self.lib, ignore_errors=True)
        self.home.mkdir(parents=True, exist_ok=True)
        # Run Maven on a copy so nothing it writes lands in the repository.
        pom = self.home / "pom.xml"
        shutil.copyfile(KAFKA_POM, pom)
        mvn = [shutil.which("mvn") or "mvn", "-B", "-q", "-f", str(pom), MVN_COPY_DEPENDENCIES]
        mvn += ["-DincludeScope=runtime", f"-DoutputDirectory={partial}"]
        run_checked(mvn, "mvn copy-dependencies", cwd=self.home)
        # Rename then stamp: an interrupted download never looks like a finished install.
        partial.rename(self.lib)
        self.stamp.write_text(self.pom_digest() + "\n")
        jars = len(list(self.lib.glob("*.jar")))
        note(f"{self.label}: installed {jars} jars in {time.monotonic() - started:.1f} s")

    def write_config(self) -> None:
        # A fresh log dir per start: format refuses a formatted dir, and the quorum voter's
        # host, port and directory id are baked in at format time.
        shutil.rmtree(self.data_dir, ignore_errors=True)
        shutil.rmtree(self.log_dir, ignore_errors=True)
        self.data_dir.mkdir(parents=True)
        self.log_dir.mkdir(parents=True)
        self.props_file.write_text(self.server_properties())
        self.log4j_file.write_text(LOG4J2_PROPERTIES)

    def server_properties(self) -> str:
        single = KAFKA_PROPERTIES.format(
            host=HOST,
            port=self.port,
            sasl_port=self.sasl_port,
            sasl_user=KAFKA_SASL_USER,
            controller_port=self.controller_port,
            log_dirs=self.data_dir,
        )
        if not self.in_cluster:
            return single
        return cluster_properties(single, self.node, self.settings)

    def java_cmd(self, java: Path, *jvm_options: str) -> list[str]:
        # Quoted wildcard: java, not a shell, expands lib/* to every jar in it.
        return [str(java), *jvm_options, "-cp", f"{self.lib}/*"]

    def format_storage(self, java: Path, cluster_id: str | None = None) -> None:
        """A new log dir: a cluster of its own (``--standalone``), or a node of the cluster
        ``cluster_id`` whose controllers are the static voters of its properties."""
        cmd = [*self.java_cmd(java, "-Xmx256m"), "kafka.tools.StorageTool", "format"]
        if cluster_id is None:
            cmd += ["--standalone", "-t", new_cluster_id(), "-c", str(self.props_file)]
        else:
            cmd += ["-t", cluster_id, "-c", str(self.props_file)]
        # The SCRAM credentials go into the bootstrap metadata: the broker knows them from its
        # first start, with no admin call racing the first clients.
        scram = f"{KAFKA_SASL_MECHANISM}=[name={KAFKA_SASL_USER},password={KAFKA_SASL_PASSWORD}]"
        cmd += ["--add-scram", scram]
        run_checked(cmd, "kafka storage format", cwd=self.run_dir)

    def launch(self, java: Path) -> subprocess.Popen[bytes]:
        logging = [
            f"-Dlog4j2.configurationFile={self.log4j_file}",
            f"-Dkafka.logs.dir={self.log_dir}",
        ]
        cmd = self.java_cmd(java, *KAFKA_JVM_OPTIONS, *logging)
        cmd += ["kafka.Kafka", str(self.props_file)]
        with self.out_file.open("wb") as out:
            # Own session: the broker outlives this script and ignores the terminal's Ctrl-C;
            # its pid is also its process group id, which stop_pid signals.
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.run_dir,
                start_new_session=True,
            )
        self.pid_file.write_text(f"{proc.pid}\n")
        return proc

    def wait_ready(self, proc: subprocess.Popen[bytes]) -> None:
        # The broker port opens only once the broker is unfenced and serving, so a TCP connect
        # is a real signal; the metadata round trip then proves the protocol works end to end.
        deadline = time.monotonic() + KAFKA_READY_SECONDS
        problem = "not started"
        answering_since: float | None = None  # the plaintext listener's first answer
        scram_written = False
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                code = proc.returncode
                raise InfraError(
                    f"{self.label} exited with code {code} while starting\n{self.log_tail()}"
                )
            timeout = min(10.0, max(1.0, deadline - time.monotonic()))
            problem = self.probe(timeout) or ""
            if not problem:
                answering_since = answering_since or time.monotonic()
                problem = self.probe_sasl(timeout) or ""
            if not problem:
                return
            if (
                answering_since is not None
                and not scram_written
                and time.monotonic() - answering_since > SCRAM_GRACE_S
            ):
                scram_written = self.write_scram_user(timeout)
            time.sleep(0.2)
        waited = f"{KAFKA_READY_SECONDS:.0f} s"
        raise InfraError(f"{self.label} not ready after {waited}: {problem}\n{self.log_tail()}")

    def write_scram_user(self, timeout: float) -> bool:
        """Write the SASL listener's SCRAM user again, through the plaintext listener: seen in
        CI, a broker restarted on its data after a whole test run refused the user `format`
        had added (its credential in the bootstrap checkpoint, none in the log), while the
        plaintext listener served. The user is this script's own, so writing it is safe."""
        upsert = UserScramCredentialUpsertion(
            KAFKA_SASL_USER,
            ScramCredentialInfo(ScramMechanism[KAFKA_SASL_MECHANISM.replace("-", "_")], 8192),
            KAFKA_SASL_PASSWORD.encode(),
        )
        admin = AdminClient({"bootstrap.servers": self.endpoint})
        try:
            for future in admin.alter_user_scram_credentials([upsert]).values():
                future.result(timeout)
        except KafkaException as exc:
            note(
                f"{self.label}: the SCRAM user did not authenticate; writing it again failed: {exc}"
            )
            return False
        note(f"{self.label}: the SCRAM user {KAFKA_SASL_USER} did not authenticate; written again")
        return True

    def log_tail(self, lines: int = 25) -> str:
        parts = [tail(self.log_dir / "server.log", lines), tail(self.out_file, lines)]
        return "\n".join(p for p in parts if p)

    def log_summary(self, lines: int = 25) -> str:
        """The broker's warnings, errors, starts and stops (its INFO lines drown them), its
        standard output, and where a log dir that would not start was kept."""
        parts = [
            tail(self.log_dir / "server.log", lines, KAFKA_NOTABLE_LINE),
            tail(self.out_file, lines),
        ]
        if (self.run_dir / "failed").is_dir():
            parts.append(f"(a log dir that would not start is kept in {self.run_dir / 'failed'})")
        return "\n".join(p for p in parts if p)

    def down(self, mode: StopMode = StopMode.FAST) -> None:
        """Stop the broker; the log dir stays (the next `up` formats a new one, `restart`
        starts on it)."""
        pid = read_pid(self.pid_file)
        if pid is not None and process_alive(pid, self.marker):
            if mode is StopMode.FAST:
                note(f"{self.label}: stopping pid {pid}")
                self.stop_pid(pid)
            else:  # a broker has no immediate shutdown short of a kill
                note(f"{self.label}: killing pid {pid} (SIGKILL)")
                signal_group(pid, signal.SIGKILL)
                wait_gone(pid, self.marker, 10)
        elif pid is not None:
            note(f"{self.label}: pid {pid} was already gone; cleaning up")
        kill_leftovers(self.run_dir, "java")
        self.pid_file.unlink(missing_ok=True)

    def stop_pid(self, pid: int) -> None:
        # SIGTERM runs the broker's controlled shutdown; SIGKILL only if that hangs.
        signal_group(pid, signal.SIGTERM)
        if not wait_gone(pid, self.marker, KAFKA_STOP_GRACE_SECONDS):
            grace = f"{KAFKA_STOP_GRACE_SECONDS:.0f} s"
            note(f"{self.label}: no exit {grace} after SIGTERM; sending SIGKILL")
            signal_group(pid, signal.SIGKILL)
            wait_gone(pid, self.marker, 5)


class KafkaCluster:
    """``settings.kafka_brokers`` combined broker/controller nodes (KRaft, static voters) on
    consecutive ports, replicated as a production cluster is: internal topics and new topics
    on min(3, brokers) replicas, ``min.insync.replicas`` 2 where there are three or more."""

    name = "kafka"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.nodes = [Kafka(settings, n) for n in range(1, settings.kafka_brokers + 1)]

    @property
    def endpoint(self) -> str:
        return ",".join(node.endpoint for node in self.nodes)

    def env(self) -> dict[str, str]:
        return {"DUCTOR_BOOTSTRAP_SERVERS": self.endpoint}

    def sasl_env(self) -> dict[str, str]:
        return {
            **self.nodes[0].sasl_env(),
            "DUCTOR_BOOTSTRAP_SERVERS": ",".join(n.sasl_endpoint for n in self.nodes),
        }

    def node(self, number: int) -> Kafka:
        if not 1 <= number <= len(self.nodes):
            raise InfraError(f"kafka has nodes 1 to {len(self.nodes)}, not {number}")
        return self.nodes[number - 1]

    def status(self) -> Status:
        """Running if every node runs and answers; else the first that does not, named."""
        for node in self.nodes:
            found = node.status()
            if found.state is not State.RUNNING:
                detail = f"{node.label}: {found.detail}" if found.detail else node.label
                return Status(found.state, found.pid, detail)
        return Status(State.RUNNING, self.nodes[0].status().pid)

    def up(self) -> None:
        if all(node.status().state is State.RUNNING for node in self.nodes):
            note(f"kafka: {len(self.nodes)} brokers already running and answering; nothing to do")
            return
        self.down()
        started = time.monotonic()
        java = self.nodes[0].prepare()
        for node in self.nodes[1:]:
            node.prepare()  # (every node's ports free)
        cluster_id = new_cluster_id()
        for node in self.nodes:
            node.write_config()
            node.format_storage(java, cluster_id)
        self._launch_all(java)
        note(f"kafka: {len(self.nodes)} brokers started in {time.monotonic() - started:.1f} s")

    def _launch_all(self, java: Path, nodes: Sequence[Kafka] | None = None) -> None:
        # Every node first: a broker answers only once a majority of the controllers runs.
        launched = [(node, node.launch(java)) for node in nodes or self.nodes]
        for node, proc in launched:
            node.wait_launched(proc)

    def down(self, mode: StopMode = StopMode.FAST) -> None:
        for node in reversed(self.nodes):
            node.down(mode)

    def log_summary(self, lines: int = 25) -> str:
        return "\n".join(node.log_summary(lines) for node in self.nodes)

    def restart(self, mode: StopMode = StopMode.FAST, down_for_s: float = 0.0) -> None:
        """Every node stopped by ``mode``, then started again on its data."""
        self.down(mode)
        wait_down(self.name, down_for_s)
        started = time.monotonic()
        java = self.nodes[0].prepare(grace_s=PORT_RELEASE_GRACE_S)
        for node in self.nodes:
            node.prepare(grace_s=PORT_RELEASE_GRACE_S)
            node.check_restartable()
        self._launch_all(java)
        took = time.monotonic() - started
        note(f"kafka: {len(self.nodes)} brokers started on their data in {took:.1f} s")

    def restart_node(self, number: int, mode: StopMode, down_for_s: float = 0.0) -> None:
        """One node stopped by ``mode`` and started again on its data; the others serve."""
        self.node(number).restart(mode, down_for_s)

    def kill_node(self, number: int) -> None:
        self.node(number).down(StopMode.KILL)


def cluster_properties(single: str, node: int, settings: Settings) -> str:
    """A cluster node's properties: the single broker's, with its node id, the static voters,
    and the replication of a production cluster."""
    brokers = settings.kafka_brokers
    voters = ",".join(
        f"{n}@{HOST}:{settings.controller_port + 3 * (n - 1)}" for n in range(1, brokers + 1)
    )
    replicas = min(3, brokers)
    min_isr = 2 if replicas >= 3 else 1
    replaced = {
        "node.id": f"node.id={node}",
        "controller.quorum.bootstrap.servers": f"controller.quorum.voters={voters}",
        **{key: f"{key}={replicas}" for key in REPLICATION_KEYS},
        **{key: f"{key}={min_isr}" for key in MIN_ISR_KEYS},
    }
    lines = [replaced.get(line.split("=", 1)[0], line) for line in single.splitlines()]
    lines += [
        "# A cluster: topics created without a replication factor get the cluster's.",
        f"default.replication.factor={replicas}",
        f"min.insync.replicas={min_isr}",
    ]
    return "\n".join(lines) + "\n"


REPLICATION_KEYS = {
    "offsets.topic.replication.factor",
    "transaction.state.log.replication.factor",
    "share.coordinator.state.topic.replication.factor",
}
MIN_ISR_KEYS = {"transaction.state.log.min.isr", "share.coordinator.state.topic.min.isr"}


MVN_COPY_DEPENDENCIES = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies"

# A small fixed heap and the serial GC suit a 2-core box; exit on OOM instead of limping on.
# No JMX flags: nothing here reads them.
KAFKA_JVM_OPTIONS = (
    "-Xms256m",
    "-Xmx512m",
    "-XX:+UseSerialGC",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
)


def new_cluster_id() -> str:
    """Kafka's Uuid.randomUuid format, without starting a JVM for `StorageTool random-uuid`."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        # Kafka also rejects a leading '-': the id would read as a command-line flag.
        if not cluster_id.startswith("-"):
            return cluster_id


# Sized for a 2-core dev box: one partition per internal topic, replication 1, few threads.
# log.flush.* and message.max.bytes stay at Kafka's defaults on purpose: tests should see the
# durability and size limits production brokers have.
KAFKA_PROPERTIES = """\
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers={host}:{controller_port}
listeners=PLAINTEXT://{host}:{port},SASL_PLAINTEXT://{host}:{sasl_port},CONTROLLER://{host}:{controller_port}
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT
inter.broker.listener.name=PLAINTEXT
# Clients of the SASL_PLAINTEXT listener authenticate with SCRAM-SHA-512; the credentials are
# written at format time (format_storage). Brokers talk to each other over PLAINTEXT, so the
# listener's login module needs no credentials of its own.
sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config=\\
  org.apache.kafka.common.security.scram.ScramLoginModule required;
# ACLs, as a production cluster has them, to try the recipes of docs/operations/access.md
# (tests/integration/test_kafka_acls.py): the KRaft authorizer, and a principal may do only
# what an ACL allows. Nothing changes for anything but the principals those recipes create:
# the ones everything else uses are super users, ANONYMOUS (the PLAINTEXT and controller
# listeners, brokers among themselves) and the SASL user ductor.
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=false
super.users=User:ANONYMOUS;User:{sasl_user}
log.dirs={log_dirs}
num.partitions=1
auto.create.topics.enable=false
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
# The consumer group protocol (KIP-848) the processors use: a dead member's partitions move
# after 10 s instead of 45 s, and assignments propagate within a second.
group.consumer.session.timeout.ms=10000
group.consumer.min.session.timeout.ms=6000
group.consumer.heartbeat.interval.ms=1000
group.consumer.min.heartbeat.interval.ms=500
num.network.threads=1
num.io.threads=2
background.threads=2
num.recovery.threads.per.data.dir=1
"""

# Plain properties format: needs no extra jars, and everything goes to one file we can tail.
LOG4J2_PROPERTIES = """\
appender.f.type=File
appender.f.name=F
appender.f.fileName=${sys:kafka.logs.dir}/server.log
appender.f.layout.type=PatternLayout
appender.f.layout.pattern=[%d] %p %m (%c)%n
rootLogger.level=INFO
rootLogger.appenderRef.f.ref=F
"""


# --------------------------------------------------------------------------- PostgreSQL


PG_BIN_ROOT = Path("/usr/lib/postgresql")


def newest_pg_bindir() -> Path | None:
    versions = [p.name for p in PG_BIN_ROOT.glob("*") if (p / "bin" / "initdb").is_file()]
    newest = max((v for v in versions if v.isdigit()), key=int, default=None)
    return PG_BIN_ROOT / newest / "bin" if newest else None


# Unix socket: `trust`, guarded by the 0700 socket dir (root uses it to create the ductor role;
# peer auth would refuse root). TCP: scram-sha-256 passwords, as a real deployment has.
# The C locale keeps sorting identical on every machine.
INITDB_OPTIONS = (
    "-U",
    "postgres",
    "--auth-local=trust",
    "--auth-host=scram-sha-256",
    "--encoding=UTF8",
    "--locale=C",
)


class Postgres:
    """The local cluster (``postgres/``, on ``settings.pg_port``), or one server of a
    primary/standby pair (``PostgresPair``): its directory, port and extra settings given."""

    name = "postgres"

    def __init__(
        self,
        settings: Settings,
        directory: str = "postgres",
        port: int | None = None,
        extra_conf: str = "",
    ) -> None:
        self.settings = settings
        self.port = port or settings.pg_port
        self.extra_conf = extra_conf
        self.root = settings.infra_dir / directory
        self.data = self.root / "data"
        self.run_dir = self.root / "run"
        self.log_file = self.run_dir / "postgres.log"

    @property
    def dsn(self) -> str:
        return f"postgresql://{PG_USER}:{PG_PASSWORD}@{HOST}:{self.port}/{PG_DATABASE}"

    @property
    def endpoint(self) -> str:
        return self.dsn.replace(f":{PG_PASSWORD}@", ":***@")

    def env(self) -> dict[str, str]:
        return {"DUCTOR_PG_DSN": self.dsn}

    def status(self) -> Status:
        pid = read_pid(self.data / "postmaster.pid")
        if pid is None:
            return Status(State.STOPPED, detail=port_note(self.port))
        # pg_ctl starts the postmaster as `postgres -D <data dir>`: the path identifies ours.
        if not process_alive(pid, str(self.data)):
            return Status(State.DEAD, pid)
        problem = self.probe(connect_timeout=3)
        return Status(State.NOT_ANSWERING, pid, problem) if problem else Status(State.RUNNING, pid)

    def log_summary(self, lines: int = 25) -> str:
        return tail(self.log_file, lines)

    def probe(self, connect_timeout: int) -> str | None:
        """None if the ductor user can log in over TCP and run a query, else the error."""
        try:
            with psycopg.connect(self.dsn, connect_timeout=connect_timeout) as conn:
                conn.execute("SELECT 1").fetchone()
        except psycopg.Error as exc:
            message = str(exc).strip()
            return message.splitlines()[0] if message else type(exc).__name__
        return None

    def up(self) -> None:
        current = self.status()
        if current.state is State.RUNNING:
            note(f"postgres: already running and answering (pid {current.pid}); nothing to do")
            return
        if current.state is not State.STOPPED:
            note(f"postgres: {current.describe(self.endpoint)}; starting it afresh")
            self.down()
        started = time.monotonic()
        self.prepare_dirs()
        if not (self.data / "PG_VERSION").is_file():
            self.initdb()
        self.write_config()
        require_free_port(self.port, "DUCTOR_LOCAL_PG_PORT", "postgres")
        deadline = time.monotonic() + PG_READY_SECONDS
        self.pg_ctl_start(deadline)
        try:
            self.create_role_and_database()
            self.wait_ready(deadline)
        except BaseException:
            self.down()
            raise
        note(f"postgres: started in {time.monotonic() - started:.1f} s")

    def bindir(self) -> Path:
        """The binaries that match the cluster's major version (Debian installs side by side)."""
        version = (self.data / "PG_VERSION").read_text().strip()
        bindir = PG_BIN_ROOT / version / "bin"
        if not (bindir / "pg_ctl").is_file():
            raise InfraError(
                f"the cluster in {self.data} was made by PostgreSQL {version}, which is not "
                f"installed; apt-get install postgresql-{version}, or delete {self.data}"
            )
        return bindir

    def as_owner(self, cmd: Sequence[str | Path]) -> list[str]:
        # initdb and postgres refuse to run as root, so root runs them as the postgres user.
        args = [str(c) for c in cmd]
        return ["runuser", "-u", "postgres", "--", *args] if os.geteuid() == 0 else args

    def prepare_dirs(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        # The socket dir doubles as the access control for `trust` auth on the socket.
        self.run_dir.chmod(0o700)
        if os.geteuid() != 0:
            return
        owner = pwd.getpwnam("postgres")
        for path in (self.root, self.run_dir):
            os.chown(path, owner.pw_uid, owner.pw_gid)
        # The postgres user must be able to walk down to its directories.
        for parent in self.root.parents:
            mode = parent.stat().st_mode
            if not mode & stat.S_IXOTH:
                note(f"postgres: making {parent} traversable (o+x) for the postgres user")
                parent.chmod(mode | stat.S_IXOTH)

    def initdb(self) -> None:
        if self.data.exists() and any(self.data.iterdir()):
            raise InfraError(f"{self.data} exists but holds no cluster; delete it and try again")
        bindir = newest_pg_bindir()
        if bindir is None:
            apt_install(["postgresql"], "no PostgreSQL server binaries found")
            bindir = newest_pg_bindir()
        if bindir is None:
            raise InfraError(f"no {PG_BIN_ROOT}/*/bin/initdb even after installing postgresql")
        note(f"postgres: creating a cluster in {self.data} with {bindir}")
        initdb = self.as_owner([bindir / "initdb", "-D", self.data, *INITDB_OPTIONS])
        run_checked(initdb, "initdb", cwd=self.root)
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write("\n# Settings managed by infra/local.py, rewritten on every start.\n")
            conf.write("include 'ductor.conf'\n")

    def write_config(self) -> None:
        socket_path = self.run_dir / f".s.PGSQL.{self.port}"
        if len(str(socket_path)) > 107:
            raise InfraError(
                f"socket path {socket_path} is too long for Unix sockets; "
                "set DUCTOR_INFRA_DIR to a shorter path"
            )
        conf = self.data / "ductor.conf"
        conf.write_text(
            PG_CONF.format(host=HOST, port=self.port, socket_dir=self.run_dir) + self.extra_conf
        )
        if os.geteuid() == 0:
            shutil.chown(conf, "postgres", "postgres")

    def pg_ctl(self, *args: str | Path) -> list[str]:
        return self.as_owner([self.bindir() / "pg_ctl", "-D", self.data, *args])

    def pg_ctl_start(self, deadline: float) -> None:
        seconds = str(max(1, int(deadline - time.monotonic())))
        cmd = self.pg_ctl("start", "-w", "-t", seconds, "-l", self.log_file)
        # Own session, like Kafka: the server must not die with this script's process group.
        done = subprocess.run(
            cmd, cwd=self.root, capture_output=True, text=True, check=False, start_new_session=True
        )
        if done.returncode != 0:
            raise InfraError(
                f"pg_ctl start failed:\n{done.stdout}{done.stderr}{tail(self.log_file)}"
            )

    def as_superuser(self, dbname: str = "postgres") -> psycopg.Connection[Any]:
        """A connection as the superuser over the server's Unix socket."""
        return psycopg.connect(
            host=str(self.run_dir),
            port=self.port,
            user="postgres",
            dbname=dbname,
            autocommit=True,
        )

    def create_role_and_database(self) -> None:
        # As the superuser; idempotent, so it runs on every start.
        with self.as_superuser() as conn:
            role = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = 'ductor'").fetchone()
            if role is None:
                note("postgres: creating role ductor")
                conn.execute("CREATE ROLE ductor LOGIN CREATEDB PASSWORD 'ductor'")
            # The workers' group role, made by the administrator as docs/operations/access.md says
            # (the `ductor` role may not create roles, so its migration only grants to it).
            worker = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = 'ductor_worker'")
            if worker.fetchone() is None:
                note("postgres: creating role ductor_worker")
                conn.execute("CREATE ROLE ductor_worker NOLOGIN")
            database = conn.execute("SELECT 1 FROM pg_database WHERE datname = 'ductor'").fetchone()
            if database is None:
                note("postgres: creating database ductor")
                conn.execute("CREATE DATABASE ductor OWNER ductor")

    def wait_ready(self, deadline: float) -> None:
        problem = "not tried"
        while time.monotonic() < deadline:
            problem = self.probe(connect_timeout=3) or ""
            if not problem:
                return
            time.sleep(0.25)
        raise InfraError(
            f"postgres not answering after {PG_READY_SECONDS:.0f} s: {problem}\n"
            f"{tail(self.log_file)}"
        )

    def restart(self, mode: StopMode = StopMode.FAST, down_for_s: float = 0.0) -> None:
        """Stop the server by ``mode`` and start it again on its data directory (`pg_ctl
        restart -m <mode>`, with an optional pause). After `immediate` or `kill` the server
        runs crash recovery from its WAL, as after a crash of the database alone: the last
        commits made with synchronous_commit off (this cluster's default) may be lost."""
        self.down(mode)
        wait_down(self.name, down_for_s)
        self.up()

    def down(self, mode: StopMode = StopMode.FAST) -> None:
        pid = read_pid(self.data / "postmaster.pid")
        if pid is not None and process_alive(pid, str(self.data)) and mode is StopMode.KILL:
            # pg_ctl starts the postmaster in a session of its own: its pid is the group of
            # every backend; any straggler is found by its working directory below.
            note(f"postgres: killing postmaster {pid} and its backends (SIGKILL)")
            signal_group(pid, signal.SIGKILL)
            wait_gone(pid, str(self.data), 10)
            kill_leftovers(self.data, "postgres")
            (self.data / "postmaster.pid").unlink(missing_ok=True)
        elif pid is not None and process_alive(pid, str(self.data)):
            note(
                f"postgres: stopping pid {pid}" + ("" if mode is StopMode.FAST else " (immediate)")
            )
            stop = self.pg_ctl("stop", "-m", mode.value, "-w", "-t", "60")
            run_checked(stop, "pg_ctl stop", cwd=self.root)
        elif pid is not None:
            note(f"postgres: postmaster {pid} was already gone; cleaning up")
            # Backends of a killed postmaster exit on their own; don't let stragglers hold the
            # shared memory that would make the next start refuse.
            kill_leftovers(self.data, "postgres")
            (self.data / "postmaster.pid").unlink(missing_ok=True)


# A primary that waits for its standby: a commit returns once the standby has flushed it, so
# a promoted standby holds every commit a client was told of.
PRIMARY_CONF = """
# A primary with a synchronous standby (PostgresPair).
synchronous_commit = on
wal_level = replica
max_wal_senders = 5
wal_keep_size = 256MB
"""
# Set once the standby streams (commits before that would wait for it forever).
SYNCHRONOUS_CONF = "synchronous_standby_names = '{standby}'\n"
STANDBY_CONF = """
# A hot standby of the primary (PostgresPair), promoted by `pg_ctl promote`.
synchronous_commit = on
hot_standby = on
primary_conninfo = 'host={socket_dir} port={primary_port} user=postgres application_name={standby}'
"""
STANDBY_NAME = "ductor_standby"


class PostgresPair:
    """A primary and a synchronous streaming standby, from the same Debian packages, for
    failover tests: the standby is made by `pg_basebackup` and promoted by `pg_ctl promote`
    (what Patroni does on a primary's loss, without the election: the tests decide). Clients
    use a multi-host DSN with target_session_attrs=read-write, so they find whichever server
    takes writes."""

    name = "postgres"

    def __init__(self, settings: Settings, port: int) -> None:
        self.settings = settings
        primary_run = settings.infra_dir / "pg-primary" / "run"
        self.primary = Postgres(settings, "pg-primary", port, PRIMARY_CONF)
        self.standby = Postgres(
            settings,
            "pg-standby",
            port + 1,
            STANDBY_CONF.format(socket_dir=primary_run, primary_port=port, standby=STANDBY_NAME),
        )

    @property
    def dsn(self) -> str:
        hosts = f"{HOST}:{self.primary.port},{HOST}:{self.standby.port}"
        return (
            f"postgresql://{PG_USER}:{PG_PASSWORD}@{hosts}/{PG_DATABASE}"
            "?target_session_attrs=read-write"
        )

    def up(self) -> None:
        """A new pair: the primary from initdb, the standby from its base backup, streaming
        and synchronous before this returns."""
        self.down(StopMode.KILL)
        for server in (self.primary, self.standby):
            shutil.rmtree(server.root, ignore_errors=True)
        self.primary.up()
        self.standby.prepare_dirs()
        backup = self.primary.as_owner(
            [
                self.primary.bindir() / "pg_basebackup",
                "-h", self.primary.run_dir, "-p", str(self.primary.port), "-U", "postgres",
                "-D", self.standby.data, "-X", "stream", "-c", "fast",
            ]
        )  # fmt: skip
        run_checked(backup, "pg_basebackup", cwd=self.standby.root)
        (self.standby.data / "standby.signal").touch()
        if os.geteuid() == 0:
            shutil.chown(self.standby.data / "standby.signal", "postgres", "postgres")
        self.standby.up()
        self.primary.extra_conf = PRIMARY_CONF + SYNCHRONOUS_CONF.format(standby=STANDBY_NAME)
        self.primary.write_config()
        run_checked(self.primary.pg_ctl("reload"), "pg_ctl reload")
        self._wait_synchronous()

    def _wait_synchronous(self) -> None:
        deadline = time.monotonic() + PG_READY_SECONDS
        # As the superuser: pg_stat_replication hides its columns from other roles.
        with self.primary.as_superuser() as conn:
            while time.monotonic() < deadline:
                row = conn.execute(
                    "SELECT sync_state FROM pg_stat_replication WHERE application_name = %s",
                    (STANDBY_NAME,),
                ).fetchone()
                if row is not None and row[0] == "sync":
                    note("postgres: the standby streams and is synchronous")
                    return
                time.sleep(0.2)
        raise InfraError(f"the standby did not become synchronous\n{tail(self.standby.log_file)}")

    def promote(self) -> None:
        """The standby takes writes (after the primary's loss)."""
        run_checked(self.standby.pg_ctl("promote", "-w", "-t", "60"), "pg_ctl promote")
        note("postgres: the standby was promoted")

    def down(self, mode: StopMode = StopMode.FAST) -> None:
        for server in (self.standby, self.primary):
            if (server.data / "PG_VERSION").is_file():
                server.down(mode)


# Development settings. fsync stays on: data must survive a crash of the machine; only
# synchronous_commit is relaxed, which can lose the last few commits but never corrupts.
PG_CONF = """\
# Written by infra/local.py on every start; edit the script, not this file.
listen_addresses = '{host}'
port = {port}
unix_socket_directories = '{socket_dir}'
max_connections = 200
shared_buffers = 256MB
synchronous_commit = off
fsync = on
"""


# --------------------------------------------------------------------------- commands


class Service(Protocol):
    name: str

    @property
    def endpoint(self) -> str: ...
    def env(self) -> dict[str, str]: ...
    def status(self) -> Status: ...
    def up(self) -> None: ...
    def down(self, mode: StopMode = StopMode.FAST) -> None: ...
    def restart(self, mode: StopMode = StopMode.FAST, down_for_s: float = 0.0) -> None: ...
    def log_summary(self, lines: int = 25) -> str: ...


def wait_down(name: str, seconds: float) -> None:
    """Keep a stopped service down for ``seconds`` (an outage of chosen length)."""
    if seconds > 0:
        note(f"{name}: down for {seconds:g} s")
        time.sleep(seconds)


def print_summary(services: Sequence[Service]) -> bool:
    """One line per service, then the env vars for the running ones. True if all run."""
    statuses = [(svc, svc.status()) for svc in services]
    for svc, status in statuses:
        print(f"{svc.name:<9} {status.describe(svc.endpoint)}")
    print_env([svc for svc, status in statuses if status.state is State.RUNNING])
    return all(status.state is State.RUNNING for _, status in statuses)


def print_env(running: Sequence[Service]) -> None:
    env = {key: value for svc in running for key, value in svc.env().items()}
    if env:
        print()
        for key, value in env.items():
            print(f"export {key}={value}")
    for svc in running:
        if isinstance(svc, Kafka | KafkaCluster):
            # Commented out: the plaintext listener stays the default for everything.
            print(f"# through the SASL_PLAINTEXT listener ({KAFKA_SASL_MECHANISM}) instead:")
            print("# export " + " ".join(f"{k}={v}" for k, v in svc.sasl_env().items()))


def run_local(
    command: str,
    services: Sequence[Service],
    mode: StopMode = StopMode.FAST,
    down_for_s: float = 0,
    node: int | None = None,
) -> int:
    if node is not None:
        _run_on_node(command, services, node, mode, down_for_s)
    else:
        _run_on_services(command, services, mode, down_for_s)
    all_running = print_summary(services)
    if command == "status" and not all_running:
        return EXIT_NOT_RUNNING
    return 0


def print_logs(services: Sequence[Service], lines: int) -> int:
    """The last lines of each service's logs (what CI prints when the tests fail)."""
    for svc in services:
        print(svc.log_summary(lines) or f"{svc.name}: no logs yet")
    return 0


def _run_on_services(
    command: str, services: Sequence[Service], mode: StopMode, down_for_s: float
) -> None:
    if command == "up":
        for svc in services:
            svc.up()
    elif command == "down":
        for svc in reversed(services):
            svc.down()
    elif command == "restart":
        for svc in services:
            svc.restart(mode, down_for_s)
    elif command == "kill":
        for svc in services:
            svc.down(StopMode.KILL)


def _run_on_node(
    command: str, services: Sequence[Service], node: int, mode: StopMode, down_for_s: float
) -> None:
    """`restart` or `kill` of one broker of the local cluster."""
    [cluster] = [svc for svc in services if isinstance(svc, KafkaCluster)]
    if command == "restart":
        cluster.restart_node(node, mode, down_for_s)
    else:
        cluster.kill_node(node)


def run_docker(command: str, names: Sequence[str], services: Sequence[Service]) -> int:
    """The same commands on infra/compose.yaml, for machines with a Docker engine."""
    if (
        shutil.which("docker") is None
        or subprocess.run(["docker", "info"], capture_output=True, check=False).returncode != 0
    ):
        raise InfraError(
            "DUCTOR_INFRA=docker but no Docker engine answers `docker info`; "
            "start Docker, or unset DUCTOR_INFRA to run Kafka and Postgres locally"
        )
    if command in ("restart", "kill", "logs"):
        raise InfraError(
            f"`{command}` works on the local services; with Docker use "
            f"`docker compose -f {COMPOSE_FILE} {command} SERVICE`"
        )
    # No names means every compose service, jaeger included.
    compose = ["docker", "compose", "-f", str(COMPOSE_FILE)]
    if command == "up":
        subprocess.run([*compose, "up", "-d", "--wait", *names], check=True)
    elif command == "down":
        args = ["stop", *names] if names else ["down"]  # `down` keeps the postgres volume
        subprocess.run([*compose, *args], check=True)
    subprocess.run([*compose, "ps", *names], check=True)
    running = subprocess.run(
        [*compose, "ps", "--status", "running", "--services", *names],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    print_env([svc for svc in services if svc.name in running])
    if command == "status" and not {svc.name for svc in services} <= set(running):
        return EXIT_NOT_RUNNING
    return 0


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="infra/local.py",
        description=__doc__.split("\n\n", 1)[0] if __doc__ else None,
    )
    parser.add_argument("command", choices=("up", "down", "status", "restart", "kill", "logs"))
    parser.add_argument("service", nargs="?", choices=SERVICES, help="default: both")
    parser.add_argument(
        "--mode",
        choices=[m.value for m in StopMode],
        default=StopMode.FAST.value,
        help="restart: how to stop (fast: a clean shutdown; immediate: pg_ctl's immediate "
        "mode, a SIGKILL for kafka; kill: SIGKILL to every process of the service)",
    )
    parser.add_argument(
        "--down-for",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="restart: stay stopped this long before starting again",
    )
    parser.add_argument(
        "--lines", type=int, default=25, metavar="N", help="logs: the last N lines of each log"
    )
    parser.add_argument(
        "--node",
        type=int,
        metavar="N",
        help="restart, kill: only node N of a kafka cluster (DUCTOR_LOCAL_KAFKA_BROKERS > 1)",
    )
    args = parser.parse_args(argv)
    if args.node is not None and (
        args.command not in ("restart", "kill") or args.service != "kafka"
    ):
        parser.error("--node goes with `restart kafka` or `kill kafka`")
    if args.command != "restart" and (args.mode != StopMode.FAST.value or args.down_for):
        parser.error("--mode and --down-for go with `restart`")
    if args.down_for < 0:
        parser.error("--down-for must be >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    names = [args.service] if args.service else []
    try:
        settings = Settings.from_env()
        kafka: Service = KafkaCluster(settings) if settings.kafka_brokers > 1 else Kafka(settings)
        everything: list[Service] = [kafka, Postgres(settings)]
        if args.node is not None and not isinstance(kafka, KafkaCluster):
            raise InfraError("--node needs a cluster: DUCTOR_LOCAL_KAFKA_BROKERS=3, say")
        services = [svc for svc in everything if svc.name in (names or SERVICES)]
        mode = os.environ.get("DUCTOR_INFRA", "local")
        if mode == "docker":
            return run_docker(args.command, names, services)
        if mode != "local":
            raise InfraError(f"DUCTOR_INFRA={mode!r}: expected 'local' (default) or 'docker'")
        if args.command == "logs":
            return print_logs(services, args.lines)
        return run_local(args.command, services, StopMode(args.mode), args.down_for, args.node)
    except InfraError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except subprocess.CalledProcessError as exc:
        print(f"error: {' '.join(map(str, exc.cmd))} exited with {exc.returncode}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
