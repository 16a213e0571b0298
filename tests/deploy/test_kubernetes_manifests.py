"""The Kubernetes manifests, rendered by kustomize (``kubectl kustomize``) for each overlay:
the standard objects validate against Kubernetes' own schemas (kubernetes-validate, strict),
the Gateway API Inference Extension's and KEDA's against the fields their references
document, the policies in the ConfigMaps pass ``kvgate policy check``, and the objects agree
with each other and with the policies (names, ports, probes, grace periods, replica counts)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from epp.scheduling.registry import CATALOG
from policies.loader import load_policy_text

ROOT = Path(__file__).resolve().parents[2]
OVERLAYS = ROOT / "deploy" / "kubernetes" / "overlays"
KUBERNETES = "1.30.0"  # the oldest release with every field used (preStop sleep)
STANDARD = {"v1", "apps/v1", "policy/v1"}

Spec = dict[str, Any]  # allowed keys -> nested spec, or None for a leaf; "*" required marks
# The fields each reference documents (required ones end in "!"):
# InferencePool: GIE api/v1/inferencepool_types.go; InferenceObjective: ../shared/reference/
# gie.md ("spec.priority", poolRef); HTTPRoute: Gateway API v1; ScaledObject: KEDA's docs
# (scaleTargetRef, replica counts, the prometheus trigger's serverAddress, query, threshold).
CUSTOM: dict[tuple[str, str], Spec] = {
    ("inference.networking.k8s.io/v1", "InferencePool"): {
        "selector!": {"matchLabels!": {}},
        "targetPorts!": [{"number!": None}],
        "endpointPickerRef!": {
            "group": None,
            "kind": None,
            "name!": None,
            "portNumber": None,
            "failureMode": None,
        },
    },
    ("inference.networking.x-k8s.io/v1alpha2", "InferenceObjective"): {
        "priority": None,
        "poolRef!": {"group": None, "kind": None, "name!": None},
    },
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): {
        "parentRefs!": [{"group": None, "kind": None, "name!": None, "namespace": None}],
        "hostnames": None,
        "rules!": [
            {
                "matches": [{"path": {"type": None, "value": None}, "headers": None}],
                "backendRefs!": [
                    {"group": None, "kind": None, "name!": None, "port": None, "weight": None}
                ],
                "timeouts": {"request": None, "backendRequest": None},
            }
        ],
    },
    ("keda.sh/v1alpha1", "ScaledObject"): {
        "scaleTargetRef!": {"apiVersion": None, "kind": None, "name!": None},
        "minReplicaCount": None,
        "maxReplicaCount": None,
        "pollingInterval": None,
        "cooldownPeriod": None,
        "triggers!": [
            {
                "type!": None,
                "metadata!": {
                    "serverAddress!": None,
                    "query!": None,
                    "threshold!": None,
                    "activationThreshold": None,
                },
            }
        ],
    },
}


def render(overlay: str) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    assert kubectl is not None, "kubectl is not installed (make test installs kubernetes-client)"
    done = subprocess.run(
        [kubectl, "kustomize", str(OVERLAYS / overlay)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def check_fields(value: Any, spec: Any, path: str) -> list[str]:
    """Keys the spec does not know and required keys missing, by path."""
    if spec is None:
        return []
    if isinstance(spec, list):
        if not isinstance(value, list):
            return [f"{path}: must be a list"]
        return [
            e for i, item in enumerate(value) for e in check_fields(item, spec[0], f"{path}[{i}]")
        ]
    if not isinstance(value, dict):
        return [f"{path}: must be a mapping"]
    if not spec:  # a free mapping (labels)
        return []
    known = {key.rstrip("!"): sub for key, sub in spec.items()}
    errors = [f"{path}.{key}: unknown field" for key in value if key not in known]
    errors += [
        f"{path}.{key[:-1]}: required"
        for key in spec
        if key.endswith("!") and key[:-1] not in value
    ]
    for key, sub in known.items():
        if key in value:
            errors += check_fields(value[key], sub, f"{path}.{key}")
    return errors


def by_kind(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


@pytest.fixture(scope="module", params=["dev", "production"])
def rendered(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    return render(request.param)


def test_standard_objects_validate_against_the_kubernetes_schemas(
    rendered: list[dict[str, Any]],
) -> None:
    standard = [d for d in rendered if d["apiVersion"] in STANDARD]
    assert {d["kind"] for d in standard} >= {
        "Namespace", "ConfigMap", "Deployment", "Service", "PodDisruptionBudget", "StatefulSet"
    }  # fmt: skip
    for doc in standard:
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)


def test_a_bad_object_fails_the_schema_check() -> None:
    deployment = by_kind(render("dev"))[("Deployment", "kvgate")]
    deployment["spec"]["replicass"] = 2
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES, strict=True)


def test_inference_and_keda_objects_use_documented_fields(rendered: list[dict[str, Any]]) -> None:
    custom = [d for d in rendered if d["apiVersion"] not in STANDARD]
    assert {(d["apiVersion"], d["kind"]) for d in custom} == set(CUSTOM)
    for doc in custom:
        spec = CUSTOM[(doc["apiVersion"], doc["kind"])]
        assert check_fields(doc["spec"], spec, f"{doc['kind']}.spec") == []
    assert check_fields({"selector": {}, "extra": 1}, CUSTOM[("inference.networking.k8s.io/v1", "InferencePool")], "p") == [
        "p.extra: unknown field", "p.targetPorts: required", "p.endpointPickerRef: required",
        "p.selector.matchLabels: required",
    ]  # fmt: skip


def test_the_policies_pass_kvgate_policy_check(
    rendered: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVGATE_ADMIN_TOKEN", "an-admin-token-of-the-secret")
    maps = {
        d["metadata"]["name"].rsplit("-", 1)[0]: d for d in rendered if d["kind"] == "ConfigMap"
    }
    for name in ("kvgate-policy", "kvgate-epp-policy"):
        text = maps[name]["data"]["policy.yaml"]
        load_policy_text(text, source=name, plugins=CATALOG)
    for name in ("gateway-policy.yaml", "epp-policy.yaml"):  # the command, on the files
        command = [sys.executable, "-m", "kvgate", "policy", "check"]
        done = subprocess.run(
            [*command, str(ROOT / "deploy/kubernetes/base" / name)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stdout + done.stderr


def test_the_objects_agree_with_each_other_and_the_policies(
    rendered: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVGATE_ADMIN_TOKEN", "an-admin-token-of-the-secret")
    objects = by_kind(rendered)
    maps = {
        d["metadata"]["name"].rsplit("-", 1)[0]: d for d in rendered if d["kind"] == "ConfigMap"
    }
    gateway_policy = load_policy_text(maps["kvgate-policy"]["data"]["policy.yaml"], plugins=CATALOG)
    epp_policy = load_policy_text(maps["kvgate-epp-policy"]["data"]["policy.yaml"], plugins=CATALOG)
    # the gateway: probes, grace, disruption budget, the ConfigMap it mounts
    gateway = objects[("Deployment", "kvgate")]
    pod = gateway["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pod["terminationGracePeriodSeconds"] >= gateway_policy.listen.shutdown_grace + pre_stop
    assert container["ports"][0]["containerPort"] == gateway_policy.listen.port
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["policy"]["configMap"]["name"] == maps["kvgate-policy"]["metadata"]["name"]
    # replicas share one canary state and one set of buckets: in Redis, which the base runs
    store = gateway_policy.limits.store
    assert store.kind == "redis" and any(r.auto_canary for r in gateway_policy.routes)
    assert store.url is not None and "kvgate-redis:6379" in store.url
    assert ("Service", "kvgate-redis") in objects
    budget = objects[("PodDisruptionBudget", "kvgate")]["spec"]
    assert (
        budget["selector"]["matchLabels"].items()
        <= pod.get("labels", gateway["spec"]["template"]["metadata"]["labels"]).items()
    )
    assert budget["minAvailable"] < gateway["spec"]["replicas"] or gateway["spec"]["replicas"] == 1
    # the InferencePool: its picker is the EPP's Service on the EPP's gRPC port
    pool = objects[("InferencePool", "chat")]["spec"]
    epp_service = objects[("Service", pool["endpointPickerRef"]["name"])]
    assert pool["endpointPickerRef"]["portNumber"] in {
        p["port"] for p in epp_service["spec"]["ports"]
    }
    epp = objects[("Deployment", "kvgate-epp")]["spec"]["template"]["spec"]["containers"][0]
    assert str(pool["endpointPickerRef"]["portNumber"]) in epp["args"]
    servers = objects[("StatefulSet", "vllm-chat")]
    assert (
        pool["selector"]["matchLabels"].items()
        <= servers["spec"]["template"]["metadata"]["labels"].items()
    )
    assert (
        pool["targetPorts"][0]["number"]
        == servers["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"]
    )
    route = objects[("HTTPRoute", "chat")]["spec"]
    assert (
        route["rules"][0]["backendRefs"][0]["name"]
        == objects[("InferencePool", "chat")]["metadata"]["name"]
    )
    objective = objects[("InferenceObjective", "chat-interactive")]
    assert objective["spec"]["poolRef"]["name"] == "chat"
    assert epp_policy.epp.priority_of("chat-interactive") == objective["spec"]["priority"]
    # KEDA scales the StatefulSet within the names both policies list
    scaled = objects[("ScaledObject", "vllm-chat")]["spec"]
    assert (scaled["scaleTargetRef"]["kind"], scaled["scaleTargetRef"]["name"]) == (
        "StatefulSet",
        "vllm-chat",
    )
    assert "vllm:num_requests_waiting" in scaled["triggers"][0]["metadata"]["query"]
    service = servers["spec"]["serviceName"]
    names = {f"vllm-chat-{i}.{service}:8000" for i in range(scaled["maxReplicaCount"])}
    for policy in (gateway_policy, epp_policy):
        listed = {e.address for e in policy.pools["chat"].endpoints}
        assert names <= listed, (names, listed)
