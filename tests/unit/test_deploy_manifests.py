"""The deployment files (deploy/): the Kubernetes manifests rendered from their values and
validated against the Kubernetes schemas (kubernetes-validate) and KEDA's (the CRD models of
cloudcoil-models-keda), each documented value changing the output as values.yaml says, and
the compose file against the Compose specification. Schemas come from installed packages."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from check_jsonschema.builtin_schemas import get_builtin_schema
from cloudcoil.models.keda import v1alpha1 as keda
from jsonschema import Draft7Validator

from genhook.config import Settings
from genhook.statuses import TaskStatus

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KUBERNETES_VERSION = "1.30"


def _load_renderer() -> Any:
    spec = importlib.util.spec_from_file_location(
        "genhook_k8s_render", DEPLOY / "kubernetes/render.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


render = _load_renderer()
GPU_VALUES = DEPLOY / "kubernetes/examples/gpu-values.yaml"


def manifests(*files: Path, migrate: bool = False, **overrides: Any) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = render.render(
        render.load_values(*files, overrides=overrides), migrate=migrate
    )
    return docs


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def with_pool(**changes: Any) -> dict[str, Any]:
    """The default CPU pool with ``changes`` (lists replace, so the pool is given whole)."""
    pool = render.load_values()["workerPools"][0]
    return {"workerPools": [render.merge(pool, changes)]}


def _unknown_fields(given: Any, kept: Any, where: str = "") -> list[str]:
    """Keys of ``given`` that the model dropped: fields the CRD's schema does not have."""
    if isinstance(given, dict) and isinstance(kept, dict):
        out = []
        for key, value in given.items():
            if key not in kept:
                out.append(f"{where}.{key}")
            else:
                out += _unknown_fields(value, kept[key], f"{where}.{key}")
        return out
    if isinstance(given, list) and isinstance(kept, list):
        return [e for g, k in zip(given, kept, strict=True) for e in _unknown_fields(g, k, where)]
    return []


def validate(doc: dict[str, Any]) -> None:
    if doc["apiVersion"].startswith("keda.sh/"):
        model = {
            "ScaledObject": keda.ScaledObject,
            "TriggerAuthentication": keda.TriggerAuthentication,
        }
        parsed = model[doc["kind"]].model_validate(doc)
        kept = parsed.model_dump(by_alias=True, exclude_unset=True, mode="json")
        assert _unknown_fields(doc, kept) == [], doc["kind"]
    else:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("files", [(), (GPU_VALUES,)], ids=["defaults", "gpu-example"])
def test_every_manifest_is_valid_against_its_schema(files: tuple[Path, ...]) -> None:
    docs = manifests(*files) + manifests(*files, migrate=True)
    for doc in docs:
        validate(doc)
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "PodDisruptionBudget", "Secret", "Job", "ScaledObject"} <= kinds


def test_the_validators_refuse_a_wrong_manifest() -> None:
    deployment = by_kind(manifests(), "Deployment")["genhook-api"]
    deployment["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(deployment)
    scaled = by_kind(manifests(), "ScaledObject")["genhook-worker-cpu"]
    scaled["spec"]["minReplicaCount"] = "none"
    with pytest.raises(ValueError, match="minReplicaCount"):
        validate(scaled)
    scaled = by_kind(manifests(), "ScaledObject")["genhook-worker-cpu"]
    scaled["spec"]["scaleTarget"] = scaled["spec"].pop("scaleTargetRef")
    with pytest.raises((ValueError, AssertionError)):
        validate(scaled)


def test_each_role_has_its_deployment_probes_and_grace() -> None:
    docs = manifests()
    deployments = by_kind(docs, "Deployment")
    assert set(deployments) == {"genhook-api", "genhook-dispatcher", "genhook-worker-cpu"}
    for name, deployment in deployments.items():
        pod = deployment["spec"]["template"]["spec"]
        container = pod["containers"][0]
        env = {e["name"]: e.get("value") for e in container["env"]}
        grace = int(env["GENHOOK_SHUTDOWN_GRACE_SECONDS"])
        assert pod["terminationGracePeriodSeconds"] > grace, name
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert pod["securityContext"]["runAsNonRoot"] is True
        secret_refs = {
            e["name"]: e["valueFrom"]["secretKeyRef"]["key"]
            for e in container["env"]
            if "valueFrom" in e
        }
        assert secret_refs == {
            "GENHOOK_DATABASE_URL": "database-url",
            "AWS_ACCESS_KEY_ID": "aws-access-key-id",
            "AWS_SECRET_ACCESS_KEY": "aws-secret-access-key",
            "GENHOOK_WEBHOOK_ENCRYPTION_KEY": "webhook-encryption-key",
        }
        assert container["args"][0] in ("api", "dispatcher", "worker")
    assert set(by_kind(docs, "PodDisruptionBudget")) == set(deployments)


def test_every_setting_the_manifests_name_exists() -> None:
    fields = set(Settings.model_fields)
    for doc in manifests(GPU_VALUES) + manifests(migrate=True):
        for container in (
            doc.get("spec", {}).get("template", {}).get("spec", {}).get("containers", [])
        ):
            for entry in container["env"]:
                name = entry["name"]
                if name.startswith("GENHOOK_"):
                    assert name.removeprefix("GENHOOK_").lower() in fields, name


def test_the_queue_query_counts_the_pool_statuses() -> None:
    assert set(render.QUEUE_STATUSES) == {TaskStatus.CREATED, TaskStatus.PROCESSING}
    assert render.queue_query(["a/b", "it's"]) == (
        "SELECT count(*) FROM tasks WHERE status IN ('created', 'processing') "
        "AND model IN ('a/b', 'it''s')"
    )


def test_the_gpu_pool_scales_to_zero_on_gpus() -> None:
    docs = manifests(GPU_VALUES)
    gpu = by_kind(docs, "Deployment")["genhook-worker-gpu"]
    pod = gpu["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["image"].endswith(":0.1.0-cuda")
    assert pod["nodeSelector"] and pod["tolerations"]
    assert {"name": "GENHOOK_LOCAL_MODELS_DEVICE", "value": "cuda"} in container["env"]
    assert "replicas" not in gpu["spec"]  # KEDA owns the count
    scaled = by_kind(docs, "ScaledObject")["genhook-worker-gpu"]
    assert scaled["spec"]["minReplicaCount"] == 0
    assert "genhook-worker-gpu" not in by_kind(docs, "PodDisruptionBudget")
    query = scaled["spec"]["triggers"][0]["metadata"]["query"]
    models = json.loads(
        next(e["value"] for e in container["env"] if e["name"] == "GENHOOK_WORKER_MODELS")
    )
    assert models and all(f"'{m}'" in query for m in models)


def _pool_env(docs: list[dict[str, Any]], name: str = "genhook-worker-cpu") -> dict[str, Any]:
    container = by_kind(docs, "Deployment")[name]["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value") for e in container["env"]}


def _pool(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return by_kind(docs, "Deployment")["genhook-worker-cpu"]


def _scaled(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return by_kind(docs, "ScaledObject")["genhook-worker-cpu"]


def holds(check: Any, docs: list[dict[str, Any]]) -> bool:
    """``check`` of ``docs``; a key or object it looks for being absent is a no."""
    try:
        return bool(check(docs))
    except (KeyError, IndexError, StopIteration):
        return False


# Each documented value, changed, and what values.yaml says it does.
CHANGES: list[tuple[str, dict[str, Any], Any]] = [
    ("name", {"name": "gh"}, lambda d: "gh-api" in by_kind(d, "Deployment")),
    (
        "namespace",
        {"namespace": "prod"},
        lambda d: {x["metadata"]["namespace"] for x in d} == {"prod"},
    ),
    (
        "image.repository",
        {"image": {"repository": "reg/gh"}},
        lambda d: _pool(d)["spec"]["template"]["spec"]["containers"][0]["image"] == "reg/gh:0.1.0",
    ),
    (
        "image.tag",
        {"image": {"tag": "2.0"}},
        lambda d: by_kind(d, "Deployment")["genhook-api"]["spec"]["template"]["spec"]["containers"][
            0
        ]["image"].endswith(":2.0"),
    ),
    (
        "image.pullPolicy",
        {"image": {"pullPolicy": "Always"}},
        lambda d: (
            _pool(d)["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] == "Always"
        ),
    ),
    (
        "shutdownGraceSeconds",
        {"shutdownGraceSeconds": 50},
        lambda d: (
            _pool_env(d)["GENHOOK_SHUTDOWN_GRACE_SECONDS"] == "50"
            and _pool(d)["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 60
        ),
    ),
    (
        "terminationMarginSeconds",
        {"terminationMarginSeconds": 1},
        lambda d: _pool(d)["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 21,
    ),
    (
        "publicBaseUrl",
        {"publicBaseUrl": "https://x.test"},
        lambda d: _pool_env(d)["GENHOOK_PUBLIC_BASE_URL"] == "https://x.test",
    ),
    (
        "s3.blobStore",
        {"s3": {"blobStore": "s3://b/p"}},
        lambda d: _pool_env(d)["GENHOOK_BLOB_STORE"] == "s3://b/p",
    ),
    (
        "s3.endpointUrl",
        {"s3": {"endpointUrl": "http://minio:9000"}},
        lambda d: _pool_env(d)["GENHOOK_S3_ENDPOINT_URL"] == "http://minio:9000",
    ),
    (
        "s3.region",
        {"s3": {"region": "eu-west-1"}},
        lambda d: _pool_env(d)["GENHOOK_S3_REGION"] == "eu-west-1",
    ),
    (
        "s3.addressingStyle",
        {"s3": {"addressingStyle": "path"}},
        lambda d: _pool_env(d)["GENHOOK_S3_ADDRESSING_STYLE"] == "path",
    ),
    (
        "env",
        {"env": {"GENHOOK_LOG_FORMAT": "json"}},
        lambda d: (
            _pool_env(d)["GENHOOK_LOG_FORMAT"] == "json"
            and _pool_env(d, "genhook-api")["GENHOOK_LOG_FORMAT"] == "json"
        ),
    ),
    (
        "secret.create",
        {"secret": {"create": False}},
        lambda d: "Secret" not in {x["kind"] for x in d},
    ),
    (
        "secret.name",
        {"secret": {"name": "mine"}},
        lambda d: (
            "mine" in by_kind(d, "Secret")
            and by_kind(d, "TriggerAuthentication")["genhook-queue"]["spec"]["secretTargetRef"][0][
                "name"
            ]
            == "mine"
        ),
    ),
    (
        "secret.databaseUrl",
        {"secret": {"databaseUrl": "postgresql+asyncpg://u:p@db/g"}},
        lambda d: (
            by_kind(d, "Secret")["genhook"]["stringData"]["queue-connection"]
            == "postgresql://u:p@db/g"
        ),
    ),
    (
        "secret.awsAccessKeyId",
        {"secret": {"awsAccessKeyId": "AK"}},
        lambda d: by_kind(d, "Secret")["genhook"]["stringData"]["aws-access-key-id"] == "AK",
    ),
    (
        "secret.awsSecretAccessKey",
        {"secret": {"awsSecretAccessKey": "SK"}},
        lambda d: by_kind(d, "Secret")["genhook"]["stringData"]["aws-secret-access-key"] == "SK",
    ),
    (
        "secret.webhookEncryptionKey",
        {"secret": {"webhookEncryptionKey": "K"}},
        lambda d: by_kind(d, "Secret")["genhook"]["stringData"]["webhook-encryption-key"] == "K",
    ),
    (
        "api.replicas",
        {"api": {"replicas": 5}},
        lambda d: by_kind(d, "Deployment")["genhook-api"]["spec"]["replicas"] == 5,
    ),
    (
        "api.port",
        {"api": {"port": 9000}},
        lambda d: (
            by_kind(d, "Deployment")["genhook-api"]["spec"]["template"]["spec"]["containers"][0][
                "ports"
            ][0]["containerPort"]
            == 9000
            and _pool_env(d, "genhook-api")["GENHOOK_PORT"] == "9000"
        ),
    ),
    (
        "api.minAvailable",
        {"api": {"minAvailable": 2}},
        lambda d: by_kind(d, "PodDisruptionBudget")["genhook-api"]["spec"]["minAvailable"] == 2,
    ),
    (
        "api.resources",
        {"api": {"resources": {"requests": {"cpu": "3"}}}},
        lambda d: (
            by_kind(d, "Deployment")["genhook-api"]["spec"]["template"]["spec"]["containers"][0][
                "resources"
            ]["requests"]["cpu"]
            == "3"
        ),
    ),
    (
        "dispatcher.replicas",
        {"dispatcher": {"replicas": 3}},
        lambda d: by_kind(d, "Deployment")["genhook-dispatcher"]["spec"]["replicas"] == 3,
    ),
    (
        "dispatcher.minAvailable",
        {"dispatcher": {"minAvailable": 0}},
        lambda d: (
            by_kind(d, "PodDisruptionBudget")["genhook-dispatcher"]["spec"]["minAvailable"] == 0
        ),
    ),
    (
        "healthPort",
        {"healthPort": 9100},
        lambda d: (
            _pool_env(d)["GENHOOK_HEALTH_PORT"] == "9100"
            and _pool(d)["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"]
            == 9100
        ),
    ),
    (
        "autoscaling.source",
        {"autoscaling": {"source": "prometheus"}},
        lambda d: (
            _scaled(d)["spec"]["triggers"][0]["type"] == "prometheus"
            and "TriggerAuthentication" not in {x["kind"] for x in d}
        ),
    ),
    (
        "autoscaling.prometheusAddress",
        {"autoscaling": {"source": "prometheus", "prometheusAddress": "http://p:9090"}},
        lambda d: _scaled(d)["spec"]["triggers"][0]["metadata"]["serverAddress"] == "http://p:9090",
    ),
    (
        "workerPools.name",
        with_pool(name="edit"),
        lambda d: "genhook-worker-edit" in by_kind(d, "Deployment"),
    ),
    (
        "workerPools.models",
        with_pool(models=["genhook/image-edit"]),
        lambda d: (
            _pool_env(d)["GENHOOK_WORKER_MODELS"] == '["genhook/image-edit"]'
            and "'genhook/image-edit'" in _scaled(d)["spec"]["triggers"][0]["metadata"]["query"]
        ),
    ),
    (
        "workerPools.replicas",
        with_pool(replicas=7, autoscaling={"enabled": False}),
        lambda d: (
            _pool(d)["spec"]["replicas"] == 7 and "ScaledObject" not in {x["kind"] for x in d}
        ),
    ),
    (
        "workerPools.gpus",
        with_pool(gpus=2),
        lambda d: (
            _pool(d)["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"][
                "nvidia.com/gpu"
            ]
            == 2
        ),
    ),
    (
        "workerPools.preload",
        with_pool(preload=["genhook/image-edit"]),
        lambda d: _pool_env(d)["GENHOOK_PRELOAD_MODELS"] == '["genhook/image-edit"]',
    ),
    (
        "workerPools.startupSeconds",
        with_pool(startupSeconds=600),
        lambda d: (
            _pool(d)["spec"]["template"]["spec"]["containers"][0]["startupProbe"][
                "failureThreshold"
            ]
            == 120
        ),
    ),
    (
        "workerPools.nodeSelector",
        with_pool(nodeSelector={"pool": "x"}),
        lambda d: _pool(d)["spec"]["template"]["spec"]["nodeSelector"] == {"pool": "x"},
    ),
    (
        "workerPools.tolerations",
        with_pool(tolerations=[{"key": "k", "operator": "Exists"}]),
        lambda d: _pool(d)["spec"]["template"]["spec"]["tolerations"][0]["key"] == "k",
    ),
    (
        "workerPools.resources",
        with_pool(resources={"requests": {"memory": "9Gi"}}),
        lambda d: (
            _pool(d)["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["memory"]
            == "9Gi"
        ),
    ),
    (
        "modelsVolume",
        {"modelsVolume": {"persistentVolumeClaim": {"claimName": "w"}}},
        lambda d: all(
            {"name": "models", "mountPath": "/models", "readOnly": True}
            in x["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
            and {"name": "models", "persistentVolumeClaim": {"claimName": "w"}}
            in x["spec"]["template"]["spec"]["volumes"]
            for x in by_kind(d, "Deployment").values()
        ),
    ),
    (
        "workerPools.env",
        with_pool(env={"GENHOOK_WORKER_CONCURRENCY": "4"}),
        lambda d: (
            _pool_env(d)["GENHOOK_WORKER_CONCURRENCY"] == "4"
            and "GENHOOK_WORKER_CONCURRENCY" not in _pool_env(d, "genhook-api")
        ),
    ),
    (
        "workerPools.minAvailable",
        with_pool(minAvailable=3),
        lambda d: (
            by_kind(d, "PodDisruptionBudget")["genhook-worker-cpu"]["spec"]["minAvailable"] == 3
        ),
    ),
    (
        "workerPools.autoscaling.enabled",
        with_pool(autoscaling={"enabled": False}),
        lambda d: (
            "ScaledObject" not in {x["kind"] for x in d} and _pool(d)["spec"]["replicas"] == 2
        ),
    ),
    (
        "workerPools.autoscaling.minReplicas",
        with_pool(autoscaling={"minReplicas": 0}),
        lambda d: (
            _scaled(d)["spec"]["minReplicaCount"] == 0
            and "genhook-worker-cpu" not in by_kind(d, "PodDisruptionBudget")
        ),
    ),
    (
        "workerPools.autoscaling.maxReplicas",
        with_pool(autoscaling={"maxReplicas": 30}),
        lambda d: _scaled(d)["spec"]["maxReplicaCount"] == 30,
    ),
    (
        "workerPools.autoscaling.tasksPerWorker",
        with_pool(autoscaling={"tasksPerWorker": 5}),
        lambda d: _scaled(d)["spec"]["triggers"][0]["metadata"]["targetQueryValue"] == "5",
    ),
    (
        "workerPools.autoscaling.pollingInterval",
        with_pool(autoscaling={"pollingInterval": 3}),
        lambda d: _scaled(d)["spec"]["pollingInterval"] == 3,
    ),
    (
        "workerPools.autoscaling.cooldownPeriod",
        with_pool(autoscaling={"cooldownPeriod": 60}),
        lambda d: _scaled(d)["spec"]["cooldownPeriod"] == 60,
    ),
]


@pytest.mark.parametrize(("key", "change", "check"), CHANGES, ids=[c[0] for c in CHANGES])
def test_each_value_changes_the_output_as_documented(
    key: str, change: dict[str, Any], check: Any
) -> None:
    before = manifests()
    after = manifests(**change)
    assert after != before, key
    assert holds(check, after), key
    assert not holds(check, before), key
    for doc in after:
        if doc not in before:  # the unchanged ones are checked by the first test
            validate(doc)


def test_every_value_in_values_yaml_has_a_check() -> None:
    """A value added to values.yaml without a line in CHANGES fails here."""
    values = render.load_values()

    def keys(node: Any, prefix: str = "") -> set[str]:
        if (
            isinstance(node, dict)
            and node
            and prefix
            not in {
                "env",
                "workerPools.env",
                "workerPools.nodeSelector",
                "modelsVolume",
                "api.resources",
                "dispatcher.resources",
                "workerPools.resources",
            }
        ):
            return set().union(
                *(keys(v, f"{prefix}.{k}" if prefix else k) for k, v in node.items())
            )
        if isinstance(node, list) and node and isinstance(node[0], dict):
            return keys(node[0], prefix)
        return {prefix}

    documented = {c[0] for c in CHANGES} | {
        "image.cudaTag",  # the GPU example's check (test_the_gpu_pool_scales_to_zero_on_gpus)
        "migrations.backoffLimit",
        "migrations.activeDeadlineSeconds",
        "dispatcher.resources",
    }
    assert keys(values) <= documented, keys(values) - documented


def test_the_migration_job_is_named_after_the_image_and_runs_db_upgrade() -> None:
    docs = manifests(
        migrate=True,
        image={"tag": "1.2.3"},
        migrations={"backoffLimit": 0, "activeDeadlineSeconds": 99},
    )
    job = by_kind(docs, "Job")["genhook-migrate-1-2-3"]
    assert job["spec"]["template"]["spec"]["containers"][0]["args"] == ["db", "upgrade"]
    assert job["spec"]["backoffLimit"] == 0 and job["spec"]["activeDeadlineSeconds"] == 99
    assert {d["kind"] for d in docs} == {"Job", "Secret"}


def test_bad_values_are_refused_with_their_name() -> None:
    with pytest.raises(render.ValuesError, match="terminationMarginSeconds"):
        manifests(terminationMarginSeconds=0)
    with pytest.raises(render.ValuesError, match=r"secret\.databaseUrl"):
        manifests(secret={"databaseUrl": "sqlite+aiosqlite:///x.db"})
    with pytest.raises(render.ValuesError, match=r"autoscaling\.source"):
        manifests(autoscaling={"source": "cpu"})


def test_the_command_line_renders_yaml(capsys: pytest.CaptureFixture[str]) -> None:
    assert render.main(["-f", str(GPU_VALUES)]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert "genhook-worker-gpu" in by_kind(docs, "Deployment")
    assert render.main(["--migrate"]) == 0


def test_the_compose_file_follows_the_compose_spec_and_the_settings() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    Draft7Validator(get_builtin_schema("vendor.compose-spec")).validate(compose)
    services = compose["services"]
    assert {"postgres", "s3", "migrate", "api", "worker", "dispatcher"} <= set(services)
    assert services["worker"]["deploy"]["replicas"] == 2
    # podman-compose reads deploy.replicas only with the mode spelled out.
    assert services["worker"]["deploy"]["mode"] == "replicated"
    assert services["api"]["command"] == ["api"] and services["migrate"]["command"] == [
        "db",
        "upgrade",
    ]
    assert all(p.startswith("127.0.0.1:") for p in services["api"]["ports"])
    fields = set(Settings.model_fields)
    for name in compose["x-genhook"]["environment"]:
        if name.startswith("GENHOOK_"):
            assert name.removeprefix("GENHOOK_").lower() in fields, name
    grace = int(compose["x-genhook"]["environment"]["GENHOOK_SHUTDOWN_GRACE_SECONDS"])
    assert int(compose["x-genhook"]["stop_grace_period"].removesuffix("s")) > grace


def test_the_deploy_test_override_swaps_only_the_backing_stores() -> None:
    """deploy/test/compose.test.yaml (make deploy-test) follows the spec and leaves genhook's
    images, commands and settings to compose.yaml: only test settings are added to them."""
    base = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    override = yaml.safe_load((DEPLOY / "test" / "compose.test.yaml").read_text())
    Draft7Validator(get_builtin_schema("vendor.compose-spec")).validate(override)
    services = override["services"]
    assert set(services) <= set(base["services"])
    for role in ("api", "worker", "dispatcher"):
        assert set(services[role]) == {"environment"}, role
        assert not set(services[role]["environment"]) & set(base["x-genhook"]["environment"])
    assert "image" not in services["migrate"]
    assert services["postgres"]["image"].startswith("${") and services["s3"]["image"].startswith(
        "${"
    )


def test_the_dockerfile_runs_genhook_unprivileged_with_health_checks() -> None:
    text = (ROOT / "Dockerfile").read_text()
    final = text.split("FROM runtime-base AS cpu", 1)[1].split("\nFROM ", 1)[0]
    assert 'ENTRYPOINT ["genhook"]' in final and "USER 10001" in final
    assert "HEALTHCHECK" in final and "healthcheck.py" in final
    assert "gcc" not in final and "build-essential" not in final
    assert "AS cuda" in text and "TORCH_VERSION=" in text


def test_the_systemd_unit_outlasts_the_shutdown_grace() -> None:
    """systemd kills after TimeoutStopSec: above the grace plus the supervisor's stop margin."""
    from genhook.runtime import supervisor

    unit: dict[str, str] = {}
    for line in (DEPLOY / "systemd/genhook.service").read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            unit.setdefault(key, value)
    assert unit["ExecStart"].endswith("genhook serve")
    assert unit["User"] == "genhook" and unit["KillMode"] == "mixed"
    grace = Settings().shutdown_grace_seconds
    bound = (
        grace + supervisor.STOP_MARGIN + supervisor.DISPATCHER_GRACE + supervisor.RELEASE_AT_STOP
    )
    assert int(unit["TimeoutStopSec"]) > bound
