"""Render genhook's Kubernetes manifests from values (deploy/kubernetes/values.yaml).

    python deploy/kubernetes/render.py [-f my-values.yaml ...] [--migrate] > genhook.yaml

Plain YAML for ``kubectl apply -f -`` or a GitOps repository: Python and PyYAML only, so the
same renderer runs on an operator's laptop, in CI and in the tests, where no Helm binary
exists (docs/deploy.md says why not a chart). ``--migrate`` renders only the migration Job.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Any

import yaml

DEFAULTS = Path(__file__).with_name("values.yaml")
# The task statuses a worker pool's queue counts (genhook.statuses.TaskStatus): waiting and
# running tasks, so KEDA neither starts pods for nothing nor removes one mid-task.
QUEUE_STATUSES = ("created", "processing")
SECRET_KEYS = {
    "GENHOOK_DATABASE_URL": "database-url",
    "AWS_ACCESS_KEY_ID": "aws-access-key-id",
    "AWS_SECRET_ACCESS_KEY": "aws-secret-access-key",
    "GENHOOK_WEBHOOK_ENCRYPTION_KEY": "webhook-encryption-key",
}
RUN_AS = 10001
DATA_DIR = "/var/lib/genhook"


class ValuesError(ValueError):
    """A value the manifests cannot be made from; the message names it."""


def merge(base: Any, over: Any) -> Any:
    """``over`` on ``base``: mappings key by key, anything else (lists too) replaced."""
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for key, value in over.items():
            out[key] = merge(base.get(key), value) if key in base else copy.deepcopy(value)
        return out
    return copy.deepcopy(over)


def load_values(*files: Path, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load(DEFAULTS.read_text())
    for path in files:
        values = merge(values, yaml.safe_load(path.read_text()) or {})
    if overrides:
        values = merge(values, overrides)
    return values


def queue_connection(database_url: str) -> str:
    """The libpq URL KEDA's PostgreSQL scaler connects with: the SQLAlchemy URL less its
    driver (``postgresql+asyncpg://`` becomes ``postgresql://``)."""
    scheme, sep, rest = database_url.partition("://")
    if not sep or scheme.split("+")[0] not in ("postgresql", "postgres"):
        raise ValuesError(f"secret.databaseUrl must be a postgresql URL, not {scheme!r}")
    return f"postgresql://{rest}"


def queue_query(models: list[str]) -> str:
    statuses = ", ".join(f"'{s}'" for s in QUEUE_STATUSES)
    query = f"SELECT count(*) FROM tasks WHERE status IN ({statuses})"
    if models:
        query += " AND model IN ({})".format(", ".join(_sql_literal(m) for m in models))
    return query


def _sql_literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def render(values: dict[str, Any], *, migrate: bool = False) -> list[dict[str, Any]]:
    """The manifests, in the order ``kubectl apply`` should create them."""
    r = _Renderer(values)
    return [r.secret(), r.migration_job()] if migrate else r.all()


class _Renderer:
    def __init__(self, values: dict[str, Any]) -> None:
        self.v = values
        self.name: str = values["name"]
        self.grace = int(values["shutdownGraceSeconds"])
        margin = int(values["terminationMarginSeconds"])
        if margin <= 0:
            raise ValuesError(
                "terminationMarginSeconds must be above 0: the kubelet would "
                "kill workers inside GENHOOK_SHUTDOWN_GRACE_SECONDS"
            )
        self.termination = self.grace + margin
        names = [pool["name"] for pool in values["workerPools"]]
        if len(set(names)) != len(names):
            raise ValuesError(f"workerPools: names must differ, got {names}")
        if values["autoscaling"]["source"] not in ("postgresql", "prometheus"):
            raise ValuesError("autoscaling.source must be postgresql or prometheus")

    # -- shared pieces ------------------------------------------------------------------

    def meta(self, name: str, component: str) -> dict[str, Any]:
        return {
            "name": name,
            "namespace": self.v["namespace"],
            "labels": self.labels(component),
        }

    def labels(self, component: str) -> dict[str, str]:
        return {"app.kubernetes.io/name": self.name, "app.kubernetes.io/component": component}

    def image(self, gpus: int = 0) -> str:
        image = self.v["image"]
        return f"{image['repository']}:{image['cudaTag'] if gpus else image['tag']}"

    def env(self, extra: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        s3 = self.v["s3"]
        plain: dict[str, Any] = {
            "GENHOOK_SHUTDOWN_GRACE_SECONDS": self.grace,
            "GENHOOK_PUBLIC_BASE_URL": self.v["publicBaseUrl"],
            "GENHOOK_BLOB_STORE": s3["blobStore"],
            "GENHOOK_S3_REGION": s3["region"],
            "GENHOOK_S3_ADDRESSING_STYLE": s3["addressingStyle"],
            "GENHOOK_HEALTH_PORT": self.v["healthPort"],
            "AWS_EC2_METADATA_DISABLED": "true",
        }
        if s3["endpointUrl"]:
            plain["GENHOOK_S3_ENDPOINT_URL"] = s3["endpointUrl"]
        plain.update(self.v["env"])
        plain.update(extra or {})
        env = [{"name": k, "value": str(v)} for k, v in plain.items()]
        secret = self.v["secret"]["name"]
        env += [
            {"name": var, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}
            for var, key in SECRET_KEYS.items()
        ]
        return env

    def container(
        self, role: list[str], *, gpus: int = 0, env: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        return {
            "name": role[0],
            "image": self.image(gpus),
            "imagePullPolicy": self.v["image"]["pullPolicy"],
            "args": role,
            "env": self.env(env),
            "securityContext": {
                "allowPrivilegeEscalation": False,
                "readOnlyRootFilesystem": True,
                "capabilities": {"drop": ["ALL"]},
            },
            "volumeMounts": [
                {"name": "data", "mountPath": DATA_DIR},
                {"name": "tmp", "mountPath": "/tmp"},  # noqa: S108 (the pod's own emptyDir)
            ],
        }

    def pod(self, component: str, container: dict[str, Any], **spec: Any) -> dict[str, Any]:
        volumes: list[dict[str, Any]] = [
            {"name": "data", "emptyDir": {}},
            {"name": "tmp", "emptyDir": {}},
        ]
        if self.v["modelsVolume"]:
            volumes.append({"name": "models", **self.v["modelsVolume"]})
            container["volumeMounts"].append(
                {"name": "models", "mountPath": "/models", "readOnly": True}
            )
        return {
            "metadata": {"labels": self.labels(component)},
            "spec": {
                "terminationGracePeriodSeconds": self.termination,
                "securityContext": {
                    "runAsNonRoot": True,
                    "runAsUser": RUN_AS,
                    "runAsGroup": RUN_AS,
                    "fsGroup": RUN_AS,
                    "seccompProfile": {"type": "RuntimeDefault"},
                },
                "containers": [container],
                "volumes": volumes,
                **spec,
            },
        }

    def deployment(
        self, name: str, component: str, replicas: int | None, pod: dict[str, Any]
    ) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "selector": {"matchLabels": self.labels(component)},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 0},
            },
            "template": pod,
        }
        if replicas is not None:  # an autoscaled pool leaves replicas to KEDA
            spec["replicas"] = replicas
        return {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": self.meta(name, component),
            "spec": spec,
        }

    def pdb(self, name: str, component: str, min_available: int) -> dict[str, Any]:
        return {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": self.meta(name, component),
            "spec": {
                "minAvailable": min_available,
                "selector": {"matchLabels": self.labels(component)},
            },
        }

    @staticmethod
    def probes(port: int | str, startup_seconds: int) -> dict[str, Any]:
        def get(path: str) -> dict[str, Any]:
            return {"httpGet": {"path": path, "port": port}}

        return {
            # Startup: the process answers (a worker preloading its models answers /healthz
            # at once); liveness and readiness begin after it.
            "startupProbe": {
                **get("/healthz"),
                "periodSeconds": 5,
                "failureThreshold": max(1, startup_seconds // 5),
            },
            "livenessProbe": {**get("/healthz"), "periodSeconds": 10, "failureThreshold": 3},
            # Ready: database and data directory usable, preloads loaded. Only a ready worker
            # counts as available, for the rollout and for the PodDisruptionBudget.
            "readinessProbe": {**get("/readyz"), "periodSeconds": 5, "failureThreshold": 2},
        }

    # -- objects ------------------------------------------------------------------------

    def secret(self) -> dict[str, Any]:
        s = self.v["secret"]
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": self.meta(s["name"], "secret"),
            "type": "Opaque",
            "stringData": {
                "database-url": s["databaseUrl"],
                "queue-connection": queue_connection(s["databaseUrl"]),
                "aws-access-key-id": s["awsAccessKeyId"],
                "aws-secret-access-key": s["awsSecretAccessKey"],
                "webhook-encryption-key": s["webhookEncryptionKey"],
            },
        }

    def migration_job(self) -> dict[str, Any]:
        m = self.v["migrations"]
        tag = str(self.v["image"]["tag"]).replace(".", "-").replace("_", "-").lower()
        container = self.container(["db", "upgrade"])
        container["name"] = "migrate"
        pod = self.pod("migrate", container, restartPolicy="Never")
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": self.meta(f"{self.name}-migrate-{tag}"[:63].rstrip("-"), "migrate"),
            "spec": {
                "backoffLimit": m["backoffLimit"],
                "activeDeadlineSeconds": m["activeDeadlineSeconds"],
                "template": pod,
            },
        }

    def api(self) -> list[dict[str, Any]]:
        a = self.v["api"]
        name = f"{self.name}-api"
        container = self.container(["api"], env={"GENHOOK_PORT": a["port"]})
        container["ports"] = [{"name": "http", "containerPort": a["port"]}]
        container.update(self.probes("http", 60))
        container["resources"] = a["resources"]
        service = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": self.meta(name, "api"),
            "spec": {
                "selector": self.labels("api"),
                "ports": [{"name": "http", "port": 80, "targetPort": "http"}],
            },
        }
        return [
            self.deployment(name, "api", a["replicas"], self.pod("api", container)),
            service,
            self.pdb(name, "api", a["minAvailable"]),
        ]

    def dispatcher(self) -> list[dict[str, Any]]:
        d = self.v["dispatcher"]
        name = f"{self.name}-dispatcher"
        container = self.container(["dispatcher"])
        container["ports"] = [{"name": "health", "containerPort": self.v["healthPort"]}]
        container.update(self.probes("health", 60))
        container["resources"] = d["resources"]
        return [
            self.deployment(name, "dispatcher", d["replicas"], self.pod("dispatcher", container)),
            self.pdb(name, "dispatcher", d["minAvailable"]),
        ]

    def pool(self, pool: dict[str, Any]) -> list[dict[str, Any]]:
        name = f"{self.name}-worker-{pool['name']}"
        component = f"worker-{pool['name']}"
        gpus = int(pool["gpus"])
        env: dict[str, Any] = {
            # One worker process per pod: the CPU models share the pod's cores among this many.
            "GENHOOK_WORKERS": 1,
            "GENHOOK_WORKER_MODELS": json.dumps(pool["models"]),
            "GENHOOK_PRELOAD_MODELS": json.dumps(pool["preload"]),
            **pool["env"],
        }
        if gpus:
            env["GENHOOK_LOCAL_MODELS_DEVICE"] = "cuda"
        container = self.container(["worker"], gpus=gpus, env=env)
        container["ports"] = [{"name": "health", "containerPort": self.v["healthPort"]}]
        container.update(self.probes("health", int(pool["startupSeconds"])))
        resources = copy.deepcopy(pool["resources"])
        if gpus:  # one worker per GPU: the pod asks for the pool's cards
            resources.setdefault("limits", {})["nvidia.com/gpu"] = gpus
        container["resources"] = resources
        spec: dict[str, Any] = {}
        if pool["nodeSelector"]:
            spec["nodeSelector"] = pool["nodeSelector"]
        if pool["tolerations"]:
            spec["tolerations"] = pool["tolerations"]
        pod = self.pod(component, container, **spec)
        scaling = pool["autoscaling"]
        replicas = None if scaling["enabled"] else pool["replicas"]
        out = [self.deployment(name, component, replicas, pod)]
        if scaling["enabled"] and scaling["minReplicas"] == 0:
            pass  # a pool that scales to zero has no pods to keep through a drain
        else:
            out.append(self.pdb(name, component, pool["minAvailable"]))
        if scaling["enabled"]:
            out.append(self.scaled_object(name, component, pool))
        return out

    def scaled_object(self, name: str, component: str, pool: dict[str, Any]) -> dict[str, Any]:
        scaling = pool["autoscaling"]
        source = self.v["autoscaling"]["source"]
        target = str(scaling["tasksPerWorker"])
        trigger: dict[str, Any]
        if source == "postgresql":
            trigger = {
                "type": "postgresql",
                "metadata": {
                    "query": queue_query(pool["models"]),
                    "targetQueryValue": target,
                    "activationTargetQueryValue": "0",
                },
                "authenticationRef": {"name": f"{self.name}-queue"},
            }
        else:
            selector = ""
            if pool["models"]:
                selector = '{model=~"%s"}' % "|".join(  # noqa: UP031 (PromQL braces)
                    m.replace(".", "\\\\.") for m in pool["models"]
                )
            trigger = {
                "type": "prometheus",
                "metadata": {
                    "serverAddress": self.v["autoscaling"]["prometheusAddress"],
                    "query": f"sum(genhook_tasks_waiting{selector}) or vector(0)",
                    "threshold": target,
                    "activationThreshold": "0",
                },
            }
        return {
            "apiVersion": "keda.sh/v1alpha1",
            "kind": "ScaledObject",
            "metadata": self.meta(name, component),
            "spec": {
                "scaleTargetRef": {"name": name},
                "minReplicaCount": scaling["minReplicas"],
                "maxReplicaCount": scaling["maxReplicas"],
                "pollingInterval": scaling["pollingInterval"],
                "cooldownPeriod": scaling["cooldownPeriod"],
                "triggers": [trigger],
            },
        }

    def trigger_auth(self) -> dict[str, Any]:
        return {
            "apiVersion": "keda.sh/v1alpha1",
            "kind": "TriggerAuthentication",
            "metadata": self.meta(f"{self.name}-queue", "autoscaling"),
            "spec": {
                "secretTargetRef": [
                    {
                        "parameter": "connection",
                        "name": self.v["secret"]["name"],
                        "key": "queue-connection",
                    }
                ]
            },
        }

    def all(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if self.v["secret"]["create"]:
            out.append(self.secret())
        out += self.api() + self.dispatcher()
        pools = self.v["workerPools"]
        for pool in pools:
            out += self.pool(pool)
        scaled = any(p["autoscaling"]["enabled"] for p in pools)
        if scaled and self.v["autoscaling"]["source"] == "postgresql":
            out.append(self.trigger_auth())
        return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "-f",
        "--values",
        type=Path,
        action="append",
        default=[],
        help="a values file merged over the defaults (repeatable)",
    )
    parser.add_argument(
        "--migrate", action="store_true", help="render only the migration Job (and its Secret)"
    )
    args = parser.parse_args(argv)
    try:
        docs = render(load_values(*args.values), migrate=args.migrate)
    except (ValuesError, KeyError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    sys.stdout.write(yaml.safe_dump_all(docs, sort_keys=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
