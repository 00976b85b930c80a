"""deploy/kubernetes as an operator applies it: every manifest valid against the Kubernetes API schemas of a
pinned version (kubernetes-validate, offline, strict: unknown fields are errors), KEDA's custom resources
checked field by field against what the ScaledObject CRD requires, the commands those of the Procfile and
compose, the contract's limits (30 s shutdown, 100 MB bodies, 3 600 s reads) and probes on /health."""

from __future__ import annotations

import glob
import os
import re
import runpy
import shlex

import kubernetes_validate
import pytest
import yaml

from tests.conftest import ROOT
from tests.deploy.test_procfile import compose_services, procfile

K8S_VERSION = "1.31.0"  # the oldest release the manifests support (preStop `sleep` is on by default since 1.30)
DEPLOY = os.path.join(ROOT, "deploy", "kubernetes")
SECRET = "gateway-secrets"
_SECRETISH = re.compile(r"PASSWORD|SECRET|TOKEN|AUTH|API_KEY|CREDENTIALS|PRIVATE")
# ScaledObject spec fields (keda.sh/v1alpha1 CRD); scaleTargetRef and triggers are required
SCALED_OBJECT_FIELDS = {"advanced", "cooldownPeriod", "fallback", "idleReplicaCount", "initialCooldownPeriod",
                        "maxReplicaCount", "minReplicaCount", "pollingInterval", "scaleTargetRef", "triggers"}
TRIGGER_FIELDS = {"type", "metadata", "name", "authenticationRef", "metricType", "useCachedMetrics"}
REDIS_TRIGGER_METADATA = {"address", "addressFromEnv", "host", "hostFromEnv", "port", "portFromEnv", "listName",
                          "listLength", "activationListLength", "databaseIndex", "enableTLS", "unsafeSsl"}


def manifest_files() -> list[str]:
    return sorted(p for p in glob.glob(os.path.join(DEPLOY, "**", "*.yaml"), recursive=True)
                  if os.path.basename(p) != "kustomization.yaml")


def documents() -> list[tuple[str, dict]]:
    found = []
    for path in manifest_files():
        with open(path) as fh:
            found += [(os.path.relpath(path, DEPLOY), doc) for doc in yaml.safe_load_all(fh) if doc]
    return found


def by_kind(kind: str) -> dict[str, dict]:
    return {doc["metadata"]["name"]: doc for _, doc in documents() if doc["kind"] == kind}


def container(workload: dict) -> dict:
    (only,) = workload["spec"]["template"]["spec"]["containers"]
    return only


def env_of(workload: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container(workload).get("env", [])}


def core_documents() -> list[tuple[str, dict]]:
    return [(path, doc) for path, doc in documents() if not doc["apiVersion"].startswith("keda.sh/")]


@pytest.mark.parametrize("path,doc", core_documents(), ids=lambda v: v if isinstance(v, str) else v["kind"])
def test_every_manifest_is_valid_for_the_pinned_kubernetes_version(path, doc):
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_the_validation_catches_a_broken_manifest():
    api = by_kind("Deployment")["gateway-api"]
    misspelt = yaml.safe_load(yaml.safe_dump(api))
    container(misspelt)["readinesProbe"] = container(misspelt).pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(misspelt, K8S_VERSION, strict=True)
    wrong_type = yaml.safe_load(yaml.safe_dump(api))
    wrong_type["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(wrong_type, K8S_VERSION, strict=True)


def test_kustomizations_list_every_manifest_and_name_one_release():
    tags = set()
    for directory in (DEPLOY, os.path.join(DEPLOY, "migrate")):
        with open(os.path.join(directory, "kustomization.yaml")) as fh:
            kustomization = yaml.safe_load(fh)
        listed = set(kustomization["resources"])
        present = {os.path.basename(p) for p in glob.glob(os.path.join(directory, "*.yaml"))} - {"kustomization.yaml"}
        assert listed == present, directory
        (image,) = kustomization["images"]
        assert image["name"] == "platform-gateway" and image["newTag"] != "latest"
        tags.add((image["newName"], image["newTag"]))
    assert len(tags) == 1, f"the migration and the Deployments must run the same release: {tags}"
    for path, doc in documents():
        if doc["kind"] in ("Deployment", "Job"):
            assert container(doc)["image"].split(":")[0] == "platform-gateway", path


def test_the_migration_is_its_own_job_applied_before_the_deployments():
    (job,) = [doc for path, doc in documents() if doc["kind"] == "Job"]
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    api_line = procfile()["api"]
    migrate = re.search(r"&& (flask --app wsgi db upgrade) &&", api_line).group(1)
    assert container(job)["command"] == shlex.split(migrate)
    with open(os.path.join(DEPLOY, "kustomization.yaml")) as fh:
        assert "migrate/job.yaml" not in yaml.safe_load(fh)["resources"]


def test_commands_are_those_of_the_procfile_and_compose():
    deployments = by_kind("Deployment")
    gunicorn = shlex.split(procfile()["api"].split("exec ", 1)[1])
    assert container(deployments["gateway-api"])["command"] == gunicorn
    assert container(deployments["gateway-api-images"])["command"] == gunicorn
    compose = compose_services()
    for name, service in (("gateway-worker", "worker"), ("gateway-worker-embeddings", "worker-embeddings")):
        command = container(deployments[name])["command"]
        # compose's command, with the pool size stated (Celery would size it by the node's cores)
        assert command[:-2] == shlex.split(compose[service]["command"]) and command[-2] == "--concurrency"
        assert int(command[-1]) >= 1
    assert container(deployments["gateway-flower"])["command"] == shlex.split(compose["flower"]["command"])
    # every periodic job runs in the workers: nothing would be scheduled on a beat process
    assert not any("beat" in container(d)["command"] for d in deployments.values())


def test_shutdown_grace_follows_the_contract():
    deployments = by_kind("Deployment")
    api = deployments["gateway-api"]
    spec = api["spec"]["template"]["spec"]
    assert spec["terminationGracePeriodSeconds"] == 30  # the contract's graceful shutdown
    pause = container(api)["lifecycle"]["preStop"]["sleep"]["seconds"]
    graceful = int(env_of(api)["GUNICORN_GRACEFUL_TIMEOUT"])
    assert pause + graceful < 30, "gunicorn's drain must end before the pod is killed"
    for name in ("gateway-worker", "gateway-worker-embeddings", "gateway-flower"):
        assert deployments[name]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 30, name
    # the image pool: an image call accepted before the stop gets its whole budget (docs/decisions.md)
    images = deployments["gateway-api-images"]
    budget = float(by_kind("ConfigMap")["gateway-config"]["data"]["IMAGE_TIMEOUT_SECONDS"])
    pause = container(images)["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert "GUNICORN_GRACEFUL_TIMEOUT" not in env_of(images)
    assert images["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > pause + budget + 10


@pytest.mark.parametrize("value,expected", [(None, 130), ("20", 20)])
def test_gunicorn_reads_the_graceful_timeout_the_api_pool_sets(monkeypatch, value, expected):
    monkeypatch.setenv("IMAGE_TIMEOUT_SECONDS", "120")
    if value is None:
        monkeypatch.delenv("GUNICORN_GRACEFUL_TIMEOUT", raising=False)
    else:
        monkeypatch.setenv("GUNICORN_GRACEFUL_TIMEOUT", value)
    settings = runpy.run_path(os.path.join(ROOT, "docker", "gunicorn.conf.py"))
    assert settings["graceful_timeout"] == expected


def test_api_pods_are_probed_on_health_and_autoscaled():
    deployments = by_kind("Deployment")
    for name in ("gateway-api", "gateway-api-images"):
        c = container(deployments[name])
        port = {p["name"]: p["containerPort"] for p in c["ports"]}
        for probe in ("readinessProbe", "livenessProbe"):
            assert c[probe]["httpGet"]["path"] == "/health", (name, probe)
            assert port[c[probe]["httpGet"]["port"]] == int(env_of(deployments[name])["PORT"])
    flower = container(deployments["gateway-flower"])
    assert flower["readinessProbe"]["httpGet"]["path"] == "/healthcheck"
    for name in ("gateway-worker", "gateway-worker-embeddings"):
        assert "inspect ping" in " ".join(container(deployments[name])["livenessProbe"]["exec"]["command"])
    (hpa,) = by_kind("HorizontalPodAutoscaler").values()
    assert hpa["spec"]["scaleTargetRef"]["name"] == "gateway-api" and hpa["spec"]["minReplicas"] >= 2
    budgets = by_kind("PodDisruptionBudget")
    for name in ("gateway-api", "gateway-api-images"):
        labels = deployments[name]["spec"]["template"]["metadata"]["labels"]
        assert budgets[name]["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_services_select_pods_and_the_ingress_routes_image_calls_to_their_pool():
    deployments = by_kind("Deployment")
    services = by_kind("Service")
    for name, service in services.items():
        matched = [d for d in deployments.values()
                   if service["spec"]["selector"].items() <= d["spec"]["template"]["metadata"]["labels"].items()]
        assert len(matched) == 1, name
        ports = {p["name"] for p in container(matched[0])["ports"]}
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= ports, name
    (ingress,) = by_kind("Ingress").values()
    (rule,) = ingress["spec"]["rules"]
    routes = {p["path"]: p["backend"]["service"]["name"] for p in rule["http"]["paths"]}
    assert routes == {"/api/v1/agents/images": "gateway-api-images", "/": "gateway-api"}
    assert "gateway-flower" not in routes.values()  # Flower is reached by port-forward only


def test_ingress_limits_match_the_contract_and_the_local_ingress():
    (ingress,) = by_kind("Ingress").values()
    notes = ingress["metadata"]["annotations"]
    with open(os.path.join(ROOT, "stack", "nginx.conf")) as fh:
        nginx = fh.read()
    body = re.search(r"client_max_body_size (\d+)m;", nginx).group(1)
    read = re.search(r"proxy_read_timeout (\d+)s;", nginx).group(1)
    assert notes["nginx.ingress.kubernetes.io/proxy-body-size"] == f"{body}m" == "100m"
    assert notes["nginx.ingress.kubernetes.io/proxy-read-timeout"] == read == "3600"
    from app.config import SETTINGS

    assert SETTINGS["MAX_CONTENT_LENGTH"][0] == 100 * 1024 * 1024


def test_settings_come_from_the_configmap_and_secrets_from_the_secret():
    from app.config import SETTINGS

    (config,) = by_kind("ConfigMap").values()
    for key, value in config["data"].items():
        assert key in SETTINGS or key == "REDIS_ADDRESS", f"unknown setting {key}"
        assert not _SECRETISH.search(key), f"{key} belongs in the Secret"
        assert isinstance(value, str)
    for path, doc in documents():
        if doc["kind"] not in ("Deployment", "Job"):
            continue
        c = container(doc)
        assert {"configMapRef": {"name": "gateway-config"}} in c["envFrom"], path
        assert {"secretRef": {"name": SECRET}} in c["envFrom"], path
        for entry in c.get("env", []):
            if _SECRETISH.search(entry["name"]):
                assert entry["valueFrom"]["secretKeyRef"]["name"] == SECRET, (path, entry["name"])
            else:
                assert entry["name"] in {"PORT", "WEB_CONCURRENCY", "GUNICORN_THREADS", "GUNICORN_GRACEFUL_TIMEOUT",
                                             "GUNICORN_ACCESS_LOG_FLUSH_MS"}


def test_keda_scaled_objects_have_the_fields_the_crd_requires_and_cover_every_queue():
    deployments = by_kind("Deployment")
    config = by_kind("ConfigMap")["gateway-config"]["data"]
    auths = by_kind("TriggerAuthentication")
    for auth in auths.values():
        assert auth["apiVersion"] == "keda.sh/v1alpha1"
        for ref in auth["spec"]["secretTargetRef"]:
            assert set(ref) == {"parameter", "name", "key"} and ref["name"] == SECRET
    scaled = by_kind("ScaledObject")
    assert set(scaled) == {"gateway-worker", "gateway-worker-embeddings"}
    for name, obj in scaled.items():
        assert obj["apiVersion"] == "keda.sh/v1alpha1"
        spec = obj["spec"]
        assert set(spec) <= SCALED_OBJECT_FIELDS and {"scaleTargetRef", "triggers"} <= set(spec), name
        target = deployments[spec["scaleTargetRef"]["name"]]
        assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"], name
        queues = set(container(target)["command"][container(target)["command"].index("-Q") + 1].split(","))
        listed = set()
        for trigger in spec["triggers"]:
            assert set(trigger) <= TRIGGER_FIELDS and trigger["type"] == "redis"
            metadata = trigger["metadata"]
            assert all(isinstance(v, str) for v in metadata.values()), "KEDA metadata values are strings"
            assert set(metadata) <= REDIS_TRIGGER_METADATA and int(metadata["listLength"]) > 0
            assert metadata["addressFromEnv"] in config
            assert trigger["authenticationRef"]["name"] in auths
            listed.add(metadata["listName"])
        assert listed == queues, f"{name} scales on {listed}, serves {queues}"
    # the main group never scales to zero: its pods run the periodic work
    assert scaled["gateway-worker"]["spec"]["minReplicaCount"] >= 1
