"""The Kubernetes base (infra/k8s) and the Dockerfile, checked without a cluster or a Docker
daemon against the code they deploy.

Every manifest of a built-in kind validates against the Kubernetes JSON schemas (strict: an
unknown field fails), which ``kubernetes-validate`` ships; the custom resources (KEDA's, the
Prometheus Operator's) have the fields the base relies on. Then the cross-checks: the
containers' environment loads through the code's own settings loader, names only variables it
reads, and gives the ports the probes and scrapes use; the probes' paths are what the health
server answers; the commands parse with the CLI's parser; the grace period covers the
shutdown bound; KEDA watches the topics and groups the code consumes, with as many replicas
at most as those topics have partitions; the PrometheusRule holds the alert rules' groups;
and the Dockerfile installs the built wheel and runs the ``ductor`` script.
"""

from __future__ import annotations

import http.client
import json
import re
import shlex
import threading
import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from confluent_kafka import KafkaException, Producer

from processor.cli.common import CliError
from processor.cli.gc import cmd_gc, parse_duration
from processor.cli.main import parse_args
from processor.cli.services import (
    cmd_migrate,
    cmd_process,
    cmd_topics_create,
    cmd_worker,
    worker_options,
)
from processor.cli.ui import cmd_ui
from processor.core.routing import TopicNames
from processor.io.config.kafka_properties import PASSTHROUGH_PREFIX as KAFKA_PASSTHROUGH_PREFIX
from processor.io.config.settings import Settings, load_settings, settings_env
from processor.io.config.values import ConfigError
from processor.io.kafka.configs import consumer_config
from processor.io.runtime.health_http import HealthServer
from processor.ui.server import UiServer
from tests import dockerfile
from tests.markdown import fences, section

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "infra" / "k8s"
KUSTOMIZATION = K8S / "kustomization.yaml"
ALERT_RULES = REPO / "infra" / "prometheus" / "ductor-alerts.yml"
PROMETHEUS_CONFIG = REPO / "infra" / "prometheus" / "prometheus.yml"
DOCKERFILE = dockerfile.DOCKERFILE
DOCKERIGNORE = REPO / ".dockerignore"

# The oldest Kubernetes the base is written for (CronJob timeZone, PDB policy/v1, HPA
# autoscaling/v2 are older), and the newest the installed schemas know.
KUBERNETES_VERSIONS = ("1.30", kubernetes_validate.latest_version())
IMAGE = "ductor"
# What each component runs: its pod template's app.kubernetes.io/component label.
COMMANDS: dict[str, Callable[..., int]] = {
    "processor": cmd_process,
    "worker": cmd_worker,
    "migrate": cmd_migrate,
    "topics": cmd_topics_create,
    "gc": cmd_gc,
    "ui": cmd_ui,
}
SERVICES = ("processor", "worker")  # long-running, probed, scraped, scaled
# After DUCTOR_SHUTDOWN_TIMEOUT_S has bounded the in-flight work, a process still leaves its
# group, marks itself stopped (up to 2 s) and flushes its telemetry before it exits.
SHUTDOWN_SLACK_S = 10.0
LIVENESS, READINESS = "livenessProbe", "readinessProbe"


# -- loading --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Manifest:
    file: str
    doc: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.doc["kind"])

    @property
    def name(self) -> str:
        return str(self.doc["metadata"]["name"])

    @property
    def id(self) -> str:
        return f"{self.file}:{self.kind}/{self.name}"


def _load_manifests() -> list[Manifest]:
    manifests = []
    for path in sorted(K8S.glob("*.yaml")):
        if path != KUSTOMIZATION:
            docs = yaml.safe_load_all(path.read_text())
            manifests += [Manifest(path.name, doc) for doc in docs if doc is not None]
    return manifests


MANIFESTS = _load_manifests()
# KEDA's and the Prometheus Operator's: kubernetes-validate knows none of them.
CUSTOM_GROUPS = ("keda.sh/", "monitoring.coreos.com/")
BUILT_IN = [m for m in MANIFESTS if not m.doc["apiVersion"].startswith(CUSTOM_GROUPS)]


def _of_kind(kind: str) -> list[Manifest]:
    return [m for m in MANIFESTS if m.kind == kind]


def _named(kind: str, name: str) -> dict[str, Any]:
    found = [m.doc for m in _of_kind(kind) if m.name == name]
    assert len(found) == 1, f"expected one {kind} named {name!r} in infra/k8s, found {len(found)}"
    return found[0]


@dataclass(frozen=True)
class Workload:
    """A Deployment, Job or CronJob: its pod template and what it runs."""

    manifest: Manifest
    labels: dict[str, str]
    pod: dict[str, Any]

    @property
    def component(self) -> str:
        return self.labels["app.kubernetes.io/component"]

    @property
    def container(self) -> dict[str, Any]:
        (container,) = self.pod["containers"]  # one container per pod, named for its part
        return dict(container)


def _workloads() -> list[Workload]:
    workloads = []
    for m in MANIFESTS:
        spec = m.doc.get("spec", {})
        if m.kind == "CronJob":
            spec = spec["jobTemplate"]["spec"]
        if m.kind in {"Deployment", "Job", "CronJob"}:
            template = spec["template"]
            workloads.append(Workload(m, template["metadata"]["labels"], template["spec"]))
    return workloads


WORKLOADS = _workloads()


def _workload(component: str) -> Workload:
    found = [w for w in WORKLOADS if w.component == component]
    assert len(found) == 1, f"expected one workload of component {component!r}"
    return found[0]


# The Secrets the base reads are the operator's (none ships with it): their names, keys and
# example values are the `kubectl create secret generic` commands the deployment page gives.
DEPLOYMENT = REPO / "docs" / "operations" / "deployment.md"
DEPLOYING = "Deploying on Kubernetes"
# What `$(openssl rand -hex 24)` gives: a token of 48 hexadecimal digits.
GENERATED_TOKEN = "0123456789abcdef" * 3
# The namespace the downward API gives a pod (metadata.namespace), here.
NAMESPACE = "ductor"


def _documented_secrets() -> dict[str, dict[str, str]]:
    """name -> {key: value} of every `kubectl create secret generic NAME --from-literal=K=V`
    in the shell blocks of the deployment page's Kubernetes section."""
    _, text = section(DEPLOYMENT.read_text(), DEPLOYING)
    secrets: dict[str, dict[str, str]] = {}
    for fence in fences(text):
        if fence.info != "sh":
            continue
        for line in fence.body.replace("\\\n", " ").splitlines():
            words = shlex.split(line.replace('"$(openssl rand -hex 24)"', GENERATED_TOKEN), True)
            if words[:4] != ["kubectl", "create", "secret", "generic"]:
                continue
            name, *options = words[4:]
            literals = [o.removeprefix("--from-literal=") for o in options]
            assert all(o.startswith("--from-literal=") for o in options), line
            secrets[name] = dict(literal.split("=", 1) for literal in literals)
    assert secrets, (
        f"docs/operations/deployment.md, {DEPLOYING!r}: no `kubectl create secret generic`"
    )
    return secrets


SECRETS = _documented_secrets()


def _secret_values(name: str) -> dict[str, str]:
    assert name in SECRETS, (
        f"the Secret {name!r} is read but docs/operations/deployment.md creates none"
    )
    return SECRETS[name]


def _environment(container: dict[str, Any]) -> dict[str, str]:
    """The variables the container gets, as the kubelet would set them from the manifests and
    the Secrets the operator creates (a ConfigMap or Secret it names must be among them), a
    `$(NAME)` in a value replaced by the variable defined before it."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            env |= _named("ConfigMap", source["configMapRef"]["name"]).get("data", {})
        else:
            env |= _secret_values(source["secretRef"]["name"])
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env[m[1]], var["value"])
        elif "secretKeyRef" in var["valueFrom"]:
            ref = var["valueFrom"]["secretKeyRef"]
            env[var["name"]] = _secret_values(ref["name"])[ref["key"]]
        elif "fieldRef" in var["valueFrom"]:
            assert var["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
            env[var["name"]] = NAMESPACE
        else:
            ref = var["valueFrom"]["configMapKeyRef"]
            env[var["name"]] = _named("ConfigMap", ref["name"])["data"][ref["key"]]
    return env


def _helpers(container: dict[str, Any]) -> set[str]:
    """Variables of the downward API that only serve to build another's value, `$(NAME)`."""
    found = {v["name"] for v in container.get("env", []) if "fieldRef" in v.get("valueFrom", {})}
    for name in found:
        used = [v for v in container.get("env", []) if f"$({name})" in v.get("value", "")]
        assert used, f"{name} is set but no variable's value uses it"
    return found


def _settings(container: dict[str, Any]) -> Settings:
    try:
        return load_settings(_environment(container))
    except ConfigError as exc:
        pytest.fail(f"container {container['name']}: the settings do not load: {exc}")


def _port(container: dict[str, Any], port: int | str) -> int:
    """A container port by number or by name."""
    if isinstance(port, int):
        return port
    numbers = [p["containerPort"] for p in container.get("ports", []) if p["name"] == port]
    assert numbers, f"container {container['name']} has no port named {port!r}"
    return int(numbers[0])


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


def _label_selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A LabelSelector (matchLabels and matchExpressions) as Kubernetes applies it."""
    tests = {
        "In": lambda e: labels.get(e["key"]) in e["values"],
        "NotIn": lambda e: labels.get(e["key"]) not in e["values"],
        "Exists": lambda e: e["key"] in labels,
        "DoesNotExist": lambda e: e["key"] not in labels,
    }
    expressions = selector.get("matchExpressions", [])
    return _selects(selector.get("matchLabels", {}), labels) and all(
        tests[e["operator"]](e) for e in expressions
    )


# -- the files and the schemas --------------------------------------------------------------


def test_every_file_is_listed_in_the_kustomization() -> None:
    listed = yaml.safe_load(KUSTOMIZATION.read_text())["resources"]
    present = sorted(p.name for p in K8S.iterdir() if p != KUSTOMIZATION)
    assert sorted(listed) == present


def test_the_base_applies_its_files_as_written() -> None:
    """The other checks read the files; the base must apply them unchanged but for the image
    (names, labels, patches belong in overlays)."""
    kustomization = yaml.safe_load(KUSTOMIZATION.read_text())
    assert set(kustomization) <= {"apiVersion", "kind", "resources", "images"}
    assert [image["name"] for image in kustomization["images"]] == [IMAGE]
    for workload in WORKLOADS:
        assert workload.container["image"] == IMAGE, workload.manifest.id


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("manifest", BUILT_IN, ids=lambda m: m.id)
def test_built_in_kinds_validate_against_the_kubernetes_schemas(
    manifest: Manifest, version: str
) -> None:
    try:
        kubernetes_validate.validate(manifest.doc, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        where = ".".join(str(p) for p in exc.path)
        pytest.fail(f"{manifest.id} against Kubernetes {version}: {where}: {exc.message}")
    except kubernetes_validate.SchemaNotFoundError as exc:
        pytest.fail(f"{manifest.id}: {exc.message} (a custom resource? see CUSTOM_GROUPS)")


# The fields of the custom resources the base relies on, as their CRDs type them. Unknown keys
# are refused where the base writes a closed set (KEDA's spec and trigger parameters), so a
# misspelt field fails here rather than at apply time.
def _object(required: str = "", closed: bool = True, **properties: Any) -> dict[str, Any]:
    schema = {"type": "object", "required": required.split(), "properties": properties}
    return schema | ({"additionalProperties": False} if closed else {})


def _array(items: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "minItems": 1, "items": items}


_STRING = {"type": "string"}
_COUNT = {"type": "integer", "minimum": 0}
_NAME = {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"}
_LABELS = {"type": "object", "additionalProperties": _STRING}
KAFKA_TRIGGER_PARAMETERS = [  # KEDA's `kafka` scaler
    "bootstrapServers",
    "bootstrapServersFromEnv",
    "consumerGroup",
    "topic",
    "lagThreshold",
    "activationLagThreshold",
    "offsetResetPolicy",
    "allowIdleConsumers",
    "scaleToZeroOnInvalidOffset",
    "excludePersistentLag",
    "limitToPartitionsWithLag",
    "ensureEvenDistributionOfPartitions",
    "version",
    "partitionLimitation",
    "sasl",
    "saslTokenProvider",
    "tls",
    "unsafeSsl",
]
_KAFKA_METADATA = {
    **_object(
        "consumerGroup topic lagThreshold offsetResetPolicy",
        closed=False,
        lagThreshold={"type": "string", "pattern": "^[1-9][0-9]*$"},
        offsetResetPolicy={"enum": ["earliest", "latest"]},
        sasl={"enum": ["none", "plaintext", "scram_sha256", "scram_sha512"]},
        tls={"enum": ["enable", "disable"]},
    ),
    "propertyNames": {"enum": KAFKA_TRIGGER_PARAMETERS},
    # KEDA's CRD types trigger metadata as a map of strings: "1000", never 1000.
    "additionalProperties": _STRING,
}


def _resource(api_version: str, kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return _object(
        "apiVersion kind metadata spec",
        apiVersion={"const": api_version},
        kind={"const": kind},
        metadata=_object("name", name=_NAME, labels=_LABELS),
        spec=spec,
    )


KEDA, MONITORING = "keda.sh/v1alpha1", "monitoring.coreos.com/v1"
CUSTOM_SCHEMAS = {
    "ScaledObject": _resource(
        KEDA,
        "ScaledObject",
        _object(
            "scaleTargetRef minReplicaCount maxReplicaCount triggers",
            scaleTargetRef=_object("name", name=_NAME, envSourceContainerName=_STRING),
            minReplicaCount=_COUNT,
            maxReplicaCount={"type": "integer", "minimum": 1},
            pollingInterval=_COUNT,
            cooldownPeriod=_COUNT,
            advanced=_object(horizontalPodAutoscalerConfig=_object(behavior={"type": "object"})),
            triggers=_array(
                _object(
                    "type metadata",
                    type={"const": "kafka"},
                    authenticationRef=_object("name", name=_NAME),
                    metadata=_KAFKA_METADATA,
                )
            ),
        ),
    ),
    "TriggerAuthentication": _resource(
        KEDA,
        "TriggerAuthentication",
        _object(
            "secretTargetRef",
            secretTargetRef=_array(
                _object(
                    "parameter name key",
                    parameter={"enum": ["username", "password", "ca", "cert", "key"]},
                    name=_NAME,
                    key=_STRING,
                )
            ),
        ),
    ),
    "ServiceMonitor": _resource(
        MONITORING,
        "ServiceMonitor",
        _object(
            "jobLabel selector endpoints",
            closed=False,
            jobLabel=_STRING,
            selector=_object("matchLabels", closed=False, matchLabels=_LABELS),
            endpoints=_array(
                _object(
                    "port",
                    closed=False,
                    port=_STRING,
                    path={"type": "string", "pattern": "^/"},
                    interval={"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
                )
            ),
        ),
    ),
    "PrometheusRule": _resource(
        MONITORING,
        "PrometheusRule",
        _object(
            "groups",
            groups=_array(
                _object(
                    "name rules",
                    closed=False,
                    name=_STRING,
                    rules=_array(
                        _object(
                            "alert expr",
                            closed=False,
                            alert=_STRING,
                            expr=_STRING,
                            labels=_LABELS,
                            annotations=_LABELS,
                            **{"for": {"type": "string", "pattern": "^[0-9]+(s|m|h)$"}},
                        )
                    ),
                )
            ),
        ),
    ),
}
CUSTOM = [m for m in MANIFESTS if m not in BUILT_IN]


@pytest.mark.parametrize("manifest", CUSTOM, ids=lambda m: m.id)
def test_custom_resources_have_the_fields_the_base_relies_on(manifest: Manifest) -> None:
    assert manifest.kind in CUSTOM_SCHEMAS, f"{manifest.id}: add the fields it relies on"
    try:
        jsonschema.validate(manifest.doc, CUSTOM_SCHEMAS[manifest.kind])
    except jsonschema.ValidationError as exc:
        where = ".".join(str(p) for p in exc.absolute_path)
        pytest.fail(f"{manifest.id}: {where}: {exc.message}")


@pytest.mark.parametrize("manifest", _of_kind("ScaledObject"), ids=lambda m: m.id)
def test_scaling_behaviour_is_a_valid_hpa_behaviour(manifest: Manifest) -> None:
    """KEDA hands `advanced.horizontalPodAutoscalerConfig.behavior` to the HPA it creates:
    it must validate as an autoscaling/v2 HPA's behavior."""
    behavior = manifest.doc["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    for rules in behavior.values():  # the schemas type these as any string
        assert {p["type"] for p in rules.get("policies", [])} <= {"Pods", "Percent"}
        assert rules.get("selectPolicy", "Max") in {"Max", "Min", "Disabled"}
    hpa = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": manifest.name},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "x"},
            "maxReplicas": manifest.doc["spec"]["maxReplicaCount"],
            "behavior": behavior,
        },
    }
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(hpa, version, strict=True)


# -- what the containers get and run --------------------------------------------------------


def test_the_base_has_every_component() -> None:
    assert sorted(w.component for w in WORKLOADS) == sorted(COMMANDS)


@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda w: w.component)
def test_every_variable_is_one_the_config_reads(workload: Workload) -> None:
    env = _environment(workload.container)
    known = set(settings_env(Settings()))  # every DUCTOR_* setting the loader reads
    for name in env.keys() - _helpers(workload.container):
        assert name.startswith("DUCTOR_"), f"{name}: not a variable ductor reads"
        assert not name.startswith("DUCTOR_TEST_"), f"{name}: a setting for tests only"
        if not name.startswith(KAFKA_PASSTHROUGH_PREFIX):
            assert name in known, f"{name} is not a setting of processor/io/config/settings.py"
    settings = _settings(workload.container)  # every value is one the loader accepts
    # DUCTOR_KAFKA_* go to librdkafka as properties: a client takes them (without
    # bootstrap servers it connects to nothing), and each reads back as its variable.
    try:
        Producer(dict(settings.kafka_extra)).flush(0)
    except KafkaException as exc:
        pytest.fail(f"a DUCTOR_KAFKA_* variable is not a librdkafka property: {exc}")
    passed = {n for n in settings_env(settings) if n.startswith(KAFKA_PASSTHROUGH_PREFIX)}
    assert passed == {n for n in env if n.startswith(KAFKA_PASSTHROUGH_PREFIX)}


@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda w: w.component)
def test_commands_are_ones_the_cli_parses(workload: Workload) -> None:
    container = workload.container
    # The image's entrypoint runs `ductor`; a `command` would replace it.
    assert "command" not in container, "give the subcommand as args"
    args = container["args"]
    try:
        parsed = parse_args(args)
    except SystemExit:
        pytest.fail(f"`ductor {shlex.join(args)}` does not parse")
    assert parsed.func is COMMANDS[workload.component]
    if parsed.func is cmd_worker:
        try:
            worker_options(parsed)
        except CliError as exc:
            pytest.fail(str(exc))
    if parsed.func is cmd_gc:
        parse_duration(parsed.finished_before)
        assert 1 <= parsed.batch_size <= 100_000


@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda w: w.component)
def test_pods_get_only_their_own_variables_and_run_as_the_image_user(workload: Workload) -> None:
    # Service links would add DUCTOR_*_SERVICE_HOST-style variables for Services named
    # ductor-*, which the config would read as settings or librdkafka properties.
    assert workload.pod["enableServiceLinks"] is False
    context = workload.pod["securityContext"]
    assert context["runAsNonRoot"] is True
    assert str(context["runAsUser"]) == _image_user().split(":")[0]


def test_workers_get_the_worker_roles_dsn_and_never_the_coordinators() -> None:
    """Step code runs in the worker's pods: they connect as the worker role (its own Secret)
    and get no DUCTOR_PG_DSN; the other components get no worker DSN."""
    for workload in WORKLOADS:
        env = _environment(workload.container)
        if workload.component == "worker":
            assert "DUCTOR_PG_DSN" not in env and "DUCTOR_PG_DSN_FILE" not in env
            dsn = _settings(workload.container).for_worker().pg_dsn
            assert dsn == _secret_values("ductor-worker-credentials")["DUCTOR_WORKER_PG_DSN"]
            assert dsn.startswith("postgresql://ductor_worker_login:")
        else:
            assert "DUCTOR_WORKER_PG_DSN" not in env, workload.component


def _secret_references() -> dict[str, set[str]]:
    """Secret name -> the keys the base reads of it (every key, for a whole `secretRef`: the
    empty string stands for that)."""
    read: dict[str, set[str]] = {}
    for workload in WORKLOADS:
        container = workload.container
        for source in container.get("envFrom", []):
            if "secretRef" in source:
                read.setdefault(source["secretRef"]["name"], set()).add("")
        for var in container.get("env", []):
            ref = var.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                read.setdefault(ref["name"], set()).add(ref["key"])
    for auth in _of_kind("TriggerAuthentication"):
        for ref in auth.doc["spec"]["secretTargetRef"]:
            read.setdefault(ref["name"], set()).add(ref["key"])
    return read


def test_no_secret_ships_with_the_base_and_each_one_it_reads_is_documented() -> None:
    """Applying the base never overwrites a Secret, nor gives a pod placeholder credentials:
    the Secrets are the operator's, created with the commands docs/operations/deployment.md gives,
    which create every key the pods and KEDA read, and nothing they do not."""
    assert _of_kind("Secret") == [], "the base ships a Secret: the operator creates them"
    for path in K8S.iterdir():
        assert "REPLACE_ME" not in path.read_text(), f"{path.name} holds a placeholder"
    read = _secret_references()
    assert sorted(read) == sorted(SECRETS), "the Secrets read are the ones documented"
    for name, keys in read.items():
        assert keys - {""} <= SECRETS[name].keys(), f"{name}: keys read but not created"
    # The documented values load as settings where the pods read them.
    env = _environment(_workload("processor").container)
    assert env["DUCTOR_PG_DSN"] == SECRETS["ductor-credentials"]["DUCTOR_PG_DSN"]
    assert _settings(_workload("ui").container).ui_token == GENERATED_TOKEN


def test_the_web_page_listens_where_its_service_and_probes_send_requests() -> None:
    """`ductor ui` on every interface, on the port its Service targets and its probes ask;
    bound so, it needs the names it answers to (DUCTOR_UI_ALLOWED_HOSTS): the Service's in
    the pod's namespace; reading it needs the token, which comes from a Secret."""
    workload = _workload("ui")
    container = workload.container
    args = parse_args(container["args"])
    assert args.host == "0.0.0.0"
    assert _port(container, "http") == args.port
    (service,) = [s for s in _services() if _selects(s["spec"]["selector"], workload.labels)]
    (port,) = service["spec"]["ports"]
    assert _port(container, port["targetPort"]) == args.port
    settings = _settings(container)
    name = service["metadata"]["name"]
    assert {
        name,
        f"{name}.{NAMESPACE}",
        f"{name}.{NAMESPACE}.svc",
        f"{name}.{NAMESPACE}.svc.cluster.local",
    } <= set(settings.ui_allowed_hosts)
    assert settings.ui_read_token_required and settings.ui_token
    (token,) = [v for v in container["env"] if v["name"] == "DUCTOR_UI_TOKEN"]
    assert "secretKeyRef" in token["valueFrom"], "the token comes from a Secret"
    for kind in ("startupProbe", LIVENESS, READINESS):
        assert _port(container, container[kind]["httpGet"]["port"]) == args.port, kind


def _get_with_host(server: UiServer, path: str, host: str) -> int:
    conn = http.client.HTTPConnection(server.host, server.port, timeout=10)
    try:
        conn.request("GET", path, headers={"Host": host})
        return conn.getresponse().status
    finally:
        conn.close()


def test_the_web_pages_probes_and_service_names_are_answered_and_others_refused() -> None:
    """The real page, with the container's settings (its database is never reached: the
    probes' path needs none): the probes' request, with its Host header, is answered 200;
    without that header the kubelet would send the pod's address, which is refused; the
    Service's names reach the page (its login, as reading needs the token); another site's
    name is refused."""
    container = _workload("ui").container
    settings = _settings(container)
    server = UiServer(settings, "127.0.0.1", 0)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        for kind in ("startupProbe", LIVENESS, READINESS):
            get = container[kind]["httpGet"]
            (host,) = [h["value"] for h in get["httpHeaders"] if h["name"] == "Host"]
            assert _get_with_host(server, get["path"], f"{host}:8080") == 200, kind
        assert _get_with_host(server, "/static/ui.css", "10.1.2.3:8080") == 400
        for name in ("ductor-ui", f"ductor-ui.{NAMESPACE}.svc.cluster.local"):
            assert _get_with_host(server, "/", name) == 303  # to the login: reading needs it
        assert _get_with_host(server, "/", "evil.example") == 400
    finally:
        server.stop()
        thread.join(10)


def test_the_scaling_comments_state_kedas_rule() -> None:
    """KEDA gives a ScaledObject with several triggers the largest replica count any of them
    asks for, never the sum of their lags; the comments say so."""
    text = (K8S / "autoscaling.yaml").read_text()
    comments = " ".join(
        line.strip().lstrip("# ") for line in text.splitlines() if line.strip().startswith("#")
    )
    assert not re.search(r"(?<!not )(add up|adds up|are summed|sum of)", comments), comments
    for scaled in _of_kind("ScaledObject"):
        assert len(scaled.doc["spec"]["triggers"]) > 1
    assert comments.count("largest") >= len(_of_kind("ScaledObject"))


# -- probes, ports and the shutdown bound ---------------------------------------------------


class _FreshProbe:
    instance_id = "ductor-test"
    assigned_partitions = 0

    def __init__(self) -> None:
        self.last_loop_at = time.monotonic()

    def problems(self, stall_s: float) -> list[str]:
        return []

    def broken(self) -> list[str]:
        return []


@pytest.fixture(scope="module")
def health_server() -> Iterator[HealthServer]:
    """The real health server, on a free loopback port; nothing listens on port 1, so its
    database check fails at once."""
    server = HealthServer(_FreshProbe(), "postgresql://u:p@127.0.0.1:1/db", port=0).start()
    yield server
    server.stop()


def _answer(server: HealthServer, path: str) -> tuple[int, dict[str, Any]]:
    conn = http.client.HTTPConnection(server.host, server.port, timeout=5)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def test_the_health_server_refuses_other_paths(health_server: HealthServer) -> None:
    assert _answer(health_server, "/health")[0] == 404  # so a wrong probe path is seen


@pytest.mark.parametrize("component", SERVICES)
def test_probes_ask_the_health_server_on_its_port(
    component: str, health_server: HealthServer
) -> None:
    container = _workload(component).container
    settings = _settings(container)
    assert settings.health_port, "DUCTOR_HEALTH_PORT is 0: the health server is off"
    assert settings.http_host not in {"127.0.0.1", "::1", "localhost"}, (
        "the kubelet probes the pod's address: DUCTOR_HTTP_HOST must not be loopback"
    )
    for kind in ("startupProbe", LIVENESS, READINESS):
        get = container[kind]["httpGet"]
        assert _port(container, get["port"]) == settings.health_port, kind
        status, body = _answer(health_server, get["path"])
        # Liveness is the loop turning (a database outage must not restart the pod);
        # readiness is the instance's problems and the database check.
        if kind == READINESS:
            assert "assigned_partitions" in body, f"{kind} {get['path']} is not /readyz"
        else:
            assert status == 200, f"{kind} {get['path']}: {status}"
            assert "last_loop_age_s" in body, f"{kind} {get['path']} is not /healthz"


@pytest.mark.parametrize("component", SERVICES)
def test_grace_period_covers_the_shutdown_bound(component: str) -> None:
    workload = _workload(component)
    settings = _settings(workload.container)
    grace = workload.pod["terminationGracePeriodSeconds"]
    assert grace >= settings.shutdown_timeout_s + SHUTDOWN_SLACK_S


def _services() -> list[dict[str, Any]]:
    return [m.doc for m in _of_kind("Service")]


def test_each_metrics_service_reaches_its_components_metrics_port() -> None:
    for component in SERVICES:
        workload = _workload(component)
        container = workload.container
        selected = [s for s in _services() if _selects(s["spec"]["selector"], workload.labels)]
        assert len(selected) == 1, f"one Service selects the {component} pods"
        (port,) = selected[0]["spec"]["ports"]
        assert _port(container, port["targetPort"]) == _settings(container).metrics_port
        assert _settings(container).metrics_port, "DUCTOR_METRICS_PORT is 0: no metrics"


def test_the_service_monitor_scrapes_the_jobs_the_alerts_expect() -> None:
    (monitor,) = [m.doc for m in _of_kind("ServiceMonitor")]
    spec = monitor["spec"]
    scraped = [s for s in _services() if _label_selects(spec["selector"], s["metadata"]["labels"])]
    assert len(scraped) == len(SERVICES), "the Services with metrics, and no other"
    for service in scraped:
        names = {p["name"] for p in service["spec"]["ports"]}
        assert {e["port"] for e in spec["endpoints"]} <= names
    jobs = {s["metadata"]["labels"][spec["jobLabel"]] for s in scraped}
    # The scrape jobs of the example Prometheus configuration, and the one the rules name.
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    assert jobs == {c["job_name"] for c in config["scrape_configs"]}
    # The jobs DuctorInstanceDown watches: every scraped one.
    (named,) = re.findall(r'\bup\{job=~"([^"]+)"\}', ALERT_RULES.read_text())
    assert set(named.split("|")) == jobs


def test_the_prometheus_rule_holds_the_alert_rules() -> None:
    (rule,) = [m.doc for m in _of_kind("PrometheusRule")]
    groups = yaml.safe_load(ALERT_RULES.read_text())["groups"]
    assert rule["spec"]["groups"] == groups, "run `make k8s-rules`"


def test_selectors_select_their_own_pods() -> None:
    for workload in WORKLOADS:
        if workload.manifest.kind == "Deployment":
            selector = workload.manifest.doc["spec"]["selector"]["matchLabels"]
            assert _selects(selector, workload.labels), workload.manifest.id
            for spread in workload.pod.get("topologySpreadConstraints", []):
                assert spread["labelSelector"]["matchLabels"] == selector
    for budget in _of_kind("PodDisruptionBudget"):
        selector = budget.doc["spec"]["selector"]["matchLabels"]
        assert [w.component for w in WORKLOADS if _selects(selector, w.labels)] == [
            budget.doc["metadata"]["labels"]["app.kubernetes.io/component"]
        ], budget.id


# -- scaling --------------------------------------------------------------------------------


def _scaled(component: str) -> tuple[dict[str, Any], Workload]:
    workload = _workload(component)
    found = [
        m.doc["spec"]
        for m in _of_kind("ScaledObject")
        if m.doc["spec"]["scaleTargetRef"]["name"] == workload.manifest.name
    ]
    assert len(found) == 1, f"one ScaledObject scales {workload.manifest.name}"
    spec = found[0]
    container = workload.container["name"]
    assert spec["scaleTargetRef"].get("envSourceContainerName", container) == container
    # The ScaledObject owns the replicas: a value in the Deployment would reset them.
    assert "replicas" not in workload.manifest.doc["spec"]
    return spec, workload


def test_processors_scale_on_the_wakeup_topics_up_to_their_partitions() -> None:
    spec, workload = _scaled("processor")
    settings = _settings(workload.container)
    consumer = consumer_config(settings, "test")
    triggers = [t["metadata"] for t in spec["triggers"]]
    assert sorted(t["topic"] for t in triggers) == TopicNames(settings.topic_prefix).wakeup_topics()
    assert {t["consumerGroup"] for t in triggers} == {consumer["group.id"]}
    assert {t["offsetResetPolicy"] for t in triggers} == {consumer["auto.offset.reset"]}
    # Partition i of every wakeup and delay topic goes to one instance (config.py).
    assert spec["maxReplicaCount"] == settings.wakeup_partitions == settings.delay_partitions
    assert spec["minReplicaCount"] >= 1, "the sweeps (timers, lost wakeups) run in processors"


def test_workers_scale_on_their_queues_steps_topic_up_to_its_partitions() -> None:
    spec, workload = _scaled("worker")
    settings = _settings(workload.container)
    queues = worker_options(parse_args(workload.container["args"])).queues
    names = TopicNames(settings.topic_prefix)
    triggers = [t["metadata"] for t in spec["triggers"]]
    wanted = [topic for q in queues for topic in names.step_topics(q)]
    assert sorted(t["topic"] for t in triggers) == sorted(wanted)
    assert {t["consumerGroup"] for t in triggers} == {settings.worker_group_id}
    assert {t["offsetResetPolicy"] for t in triggers} == {"earliest"}
    assert spec["maxReplicaCount"] == settings.step_partitions


KEDA_SASL = {
    "PLAIN": "plaintext",
    "SCRAM-SHA-256": "scram_sha256",
    "SCRAM-SHA-512": "scram_sha512",
    "GSSAPI": "gssapi",
    "OAUTHBEARER": "oauthbearer",
}


@pytest.mark.parametrize("component", SERVICES)
def test_keda_reaches_kafka_as_the_containers_do(component: str) -> None:
    spec, workload = _scaled(component)
    env = _environment(workload.container)
    settings = _settings(workload.container)
    protocol = str(settings.kafka_extra.get("security.protocol", "plaintext")).upper()
    mechanism = str(settings.kafka_extra.get("sasl.mechanism", "GSSAPI")).upper()
    tls = "enable" if protocol in {"SSL", "SASL_SSL"} else "disable"
    sasl = KEDA_SASL[mechanism] if protocol.startswith("SASL_") else "none"
    for trigger in spec["triggers"]:
        meta = trigger["metadata"]
        from_env = meta.get("bootstrapServersFromEnv")
        servers = env.get(from_env, "") if from_env else meta.get("bootstrapServers", "")
        assert servers.replace(" ", "") == settings.bootstrap_servers
        assert (meta.get("tls", "disable"), meta.get("sasl", "none")) == (tls, sasl)
        if sasl == "none":
            continue
        auth = _named("TriggerAuthentication", trigger["authenticationRef"]["name"])
        refs = {
            r["parameter"]: _secret_values(r["name"])[r["key"]]
            for r in auth["spec"]["secretTargetRef"]
        }
        assert refs["username"] == settings.kafka_extra["sasl.username"]
        assert refs["password"] == settings.kafka_extra["sasl.password"]


# -- the image ------------------------------------------------------------------------------


def _image_user() -> str:
    return dockerfile.final("USER")


def test_the_image_builds_the_wheel_and_installs_it_without_dev_dependencies() -> None:
    stages = dockerfile.stages()
    assert len(stages) >= 2, "a build stage and a runtime stage"
    build_image, _ = stages[0]
    runtime_image, runtime = stages[-1]
    build_name = build_image.split()[-1]
    assert re.fullmatch(r"python:3\.(1[1-9]|[2-9][0-9])-slim(-\w+)?", runtime_image), runtime_image
    install = dockerfile.wheel_install()
    copies = [i.rest for i in runtime if i.keyword == "COPY"]
    assert f"--from={build_name} {install.venv} {install.venv}" in copies
    assert dockerfile.runtime_env()["PATH"].startswith(f"{install.venv}/bin:")
    text = DOCKERFILE.read_text()
    assert "[dev]" not in text and "pip install -e" not in text


def test_the_image_installs_what_its_commands_need_to_connect_and_serve() -> None:
    """The wheel with the `binary` extra: the slim base has no libpq, and psycopg without one
    fails every command (`no pq wrapper available`), --help included; psycopg is told to take
    that build and no other. And with `ui` when a workload of the base runs `ductor ui`.
    tests/integration/test_wheel.py runs the same install and its commands."""
    install = dockerfile.wheel_install()
    wheel = re.fullmatch(r'"\$\(echo (\S+)/\*\.whl\)\[([\w,]+)\]"', install.what)
    assert wheel, f"the built wheel with its extras: {install.what}"
    assert wheel[1] == install.dist
    extras = set(wheel[2].split(","))
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert extras <= set(declared["optional-dependencies"]) - {"dev"}
    assert "binary" in extras
    assert dockerfile.runtime_env().get("PSYCOPG_IMPL") == "binary"
    if any(w.container["args"][0] == "ui" for w in WORKLOADS):
        assert "ui" in extras, "a workload runs `ductor ui`: the image needs the ui extra"


def test_the_image_runs_the_ductor_script_under_tini_as_a_user() -> None:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    entrypoint = json.loads(dockerfile.final("ENTRYPOINT"))
    assert entrypoint[0].endswith("/tini") and entrypoint[1:] == ["--", "ductor"]
    assert "ductor" in scripts
    parse_args(json.loads(dockerfile.final("CMD")))  # the default command parses
    user = _image_user().split(":")
    assert all(part.isdigit() and int(part) != 0 for part in user), user


def test_the_build_context_holds_what_the_dockerfile_copies_and_nothing_else() -> None:
    rules = [
        line.strip()
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert rules[0] == "*", "everything is left out unless named"
    kept = {rule[1:].rstrip("/") for rule in rules if rule.startswith("!")}
    for _, instructions in dockerfile.stages():
        for copy in (i.rest.split() for i in instructions if i.keyword == "COPY"):
            if not copy[0].startswith("--from="):
                assert {src.rstrip("/") for src in copy[:-1]} <= kept, copy
