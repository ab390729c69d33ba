"""deploy/k8s validated offline, as kustomize renders it: the committed tree is what the generator writes; every
overlay's output (``kubectl kustomize``, no cluster needed) has its core kinds pass kubernetes-validate (strict:
unknown fields fail) for the oldest Kubernetes with native sidecars and the newest bundled, and its CRD kinds
pass the prometheus-operator schemas kept in deploy/k8s/schemas (made strict the same way); the PrometheusRule
is the rules file; the component wires any Deployment's pod (readiness, preStop, grace period); no object asks
for API access; every container has requests, a memory limit, probes and a locked-down securityContext."""

import copy
import json
import shutil
import subprocess

import pytest
import yaml

from kvg_testing import ROOT, require_binary

kubernetes_validate = pytest.importorskip("kubernetes_validate")
jsonschema = pytest.importorskip("jsonschema")

from kvguardian.ops.k8s import manifests  # noqa: E402

K8S = ROOT / "deploy" / "k8s"
VERSIONS = ("1.29.0", kubernetes_validate.latest_version())  # 1.29: native sidecars (restartPolicy: Always)
CORE = ("Deployment", "Service", "DaemonSet", "ServiceAccount")
CRDS = ("ServiceMonitor", "PrometheusRule")


def kustomize(path):
    proc = subprocess.run([require_binary("kubectl"), "kustomize", str(path)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


@pytest.fixture(scope="module")
def rendered():
    return {name: kustomize(K8S / "overlays" / name) for name in manifests.OVERLAYS}


def all_docs(rendered):
    return [d for docs in rendered.values() for d in docs]


def one(docs, kind, name=None):
    (doc,) = [d for d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    return doc


def test_committed_tree_is_what_the_generator_writes(tmp_path):
    assert manifests.main(["--check"]) == 0
    assert manifests.main(["--out", str(tmp_path)]) == 0
    for name in manifests.documents():
        assert (tmp_path / name).read_text() == (K8S / name).read_text()
    generated = {p.relative_to(K8S).as_posix() for p in K8S.rglob("*.yaml")}
    assert generated == set(manifests.documents())  # no stale file left behind
    (tmp_path / "overlays" / "example" / "inference.yaml").write_text("stale")
    assert manifests.main(["--check", "--out", str(tmp_path)]) == 1


def test_every_overlay_renders_the_kinds_a_platform_needs(rendered):
    assert sorted(d["kind"] for d in rendered["platform"]) == [
        "DaemonSet", "PrometheusRule", "ServiceAccount", "ServiceMonitor"]
    assert sorted(d["kind"] for d in rendered["example"]) == ["Deployment", "Service", "Service"]
    assert {d["metadata"]["namespace"] for d in rendered["example"]} == {"llm"}


@pytest.mark.parametrize("version", VERSIONS)
def test_core_kinds_of_every_overlay_pass_kubernetes_validate_strict(rendered, version):
    core = [d for d in all_docs(rendered) if d["kind"] in CORE]
    assert {d["kind"] for d in core} == set(CORE)
    for d in core:
        kubernetes_validate.validate(d, version, strict=True)


def test_strict_validation_catches_an_unknown_field_and_a_wrong_type(rendered):
    dep = one(rendered["example"], "Deployment")
    bad = copy.deepcopy(dep)
    bad["spec"]["template"]["spec"]["containers"][0]["lifecycle"]["preStopp"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, VERSIONS[-1], strict=True)
    bad = copy.deepcopy(dep)
    bad["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = "ninety"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, VERSIONS[-1], strict=True)


def strict(schema):
    """Refuse unknown fields (what the API server does with strict field validation), except where the CRD
    says x-kubernetes-preserve-unknown-fields; int-or-string fields accept both."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if "properties" in out and not out.get("x-kubernetes-preserve-unknown-fields"):
            out.setdefault("additionalProperties", False)
        if out.get("x-kubernetes-int-or-string"):
            out.pop("type", None)
            out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
        return out
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


def crd_validator(kind):
    kept = json.loads((K8S / "schemas" / f"{kind.lower()}-v1.json").read_text())
    assert kept["kind"] == kind and kept["group"] == "monitoring.coreos.com"
    return jsonschema.Draft7Validator(strict(kept["schema"]))


@pytest.mark.parametrize("kind", CRDS)
def test_crd_kinds_pass_their_schemas_and_a_typo_fails(rendered, kind):
    doc = one(rendered["platform"], kind)
    assert doc["apiVersion"] == "monitoring.coreos.com/v1"
    assert doc["metadata"]["labels"]["release"] == "kube-prometheus-stack"  # the platform overlay's patch
    v = crd_validator(kind)
    assert list(v.iter_errors(doc)) == []
    bad = copy.deepcopy(doc)
    if kind == "ServiceMonitor":
        bad["spec"]["endpoints"][0]["relabelings"][0]["targetLabell"] = "model"
    else:
        bad["spec"]["groups"][0]["rules"][0]["exp"] = "up"
    assert list(v.iter_errors(bad))


def test_prometheus_rule_is_the_rules_file(rendered):
    rule = one(rendered["platform"], "PrometheusRule")
    source = yaml.safe_load((ROOT / "deploy" / "prometheus" / "kvguardian-rules.yml").read_text())
    assert rule["spec"] == {"groups": source["groups"]}


def check_guarded_pod(pod):
    """The component's wiring: a native sidecar whose /ready is the readiness probe, the first container's
    preStop calling its /drain with the sidecar's deadline, a grace period longer than that."""
    sidecar = next(c for c in pod["initContainers"] if c["name"] == "oom-guard")
    server = pod["containers"][0]
    assert sidecar["restartPolicy"] == "Always" and sidecar["command"][:2] == ["kv-guardian", "oom-guard"]
    port = next(p["containerPort"] for p in sidecar["ports"] if p["name"] == "guard")
    assert sidecar["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "guard"}
    deadline = float(sidecar["command"][sidecar["command"].index("--drain-deadline") + 1])
    hook = server["lifecycle"]["preStop"]["httpGet"]
    assert hook["port"] == port and hook["path"] == f"/drain?deadline={deadline:g}"
    assert pod["terminationGracePeriodSeconds"] > deadline
    assert "--host" in sidecar["command"] and "0.0.0.0" in sidecar["command"]  # probes come from the kubelet
    assert {"name": "cgroup", "mountPath": "/host/cgroup", "readOnly": True} in sidecar["volumeMounts"]
    assert any(v["name"] == "cgroup" for v in pod["volumes"])


def test_the_example_pod_wires_readiness_prestop_the_grace_period_and_its_budget(rendered):
    dep = one(rendered["example"], "Deployment")
    pod = dep["spec"]["template"]["spec"]
    check_guarded_pod(pod)
    (server,) = pod["containers"]
    assert server["resources"]["limits"][manifests.RESOURCE] == server["resources"]["requests"][manifests.RESOURCE]
    assert "KVG_KV_BUDGET_MB" in server["command"][-1]
    assert {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}} in pod["volumes"]  # kept


def test_the_component_guards_any_labelled_deployment_and_leaves_the_others(tmp_path):
    """A user's Deployment of another name, container name and volumes, with an init container of its own,
    gets the sidecar and the preStop; its own init container and volumes stay; an unlabelled one is untouched."""
    def deployment(name, labels):
        return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "labels": labels},
                "spec": {"selector": {"matchLabels": {"app": name}}, "template": {
                    "metadata": {"labels": {"app": name}},
                    "spec": {"initContainers": [{"name": "fetch-weights", "image": "busybox"}],
                             "containers": [{"name": "engine", "image": "sglang"}, {"name": "router", "image": "r"}],
                             "volumes": [{"name": "weights", "emptyDir": {}}]}}}}

    (tmp_path / "apps.yaml").write_text(yaml.safe_dump_all([
        deployment("my-llm", {manifests.ENABLED: "enabled"}), deployment("batch", {})]))
    shutil.copytree(K8S / "components" / "oom-guard", tmp_path / "oom-guard")  # kustomize wants a relative path
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({"resources": ["apps.yaml"],
                                                                 "components": ["oom-guard"]}))
    docs = kustomize(tmp_path)
    pod = one(docs, "Deployment", "my-llm")["spec"]["template"]["spec"]
    check_guarded_pod(pod)
    # the sidecar first: it is up (and guarding) while the user's init containers run
    assert [c["name"] for c in pod["initContainers"]] == ["oom-guard", "fetch-weights"]
    assert [c["name"] for c in pod["containers"]] == ["engine", "router"] and "lifecycle" not in pod["containers"][1]
    assert {v["name"] for v in pod["volumes"]} == {"weights", "cgroup"}
    labels = one(docs, "Deployment", "my-llm")["spec"]["template"]["metadata"]["labels"]
    assert labels[manifests.ENABLED] == "enabled"  # the guard Service's selector
    assert one(docs, "Deployment", "batch") == deployment("batch", {})
    for version in VERSIONS:
        kubernetes_validate.validate(one(docs, "Deployment", "my-llm"), version, strict=True)


def test_the_service_monitor_finds_every_guarded_pod_and_copies_the_fleet_labels(rendered):
    monitor = one(rendered["platform"], "ServiceMonitor")["spec"]
    service = one(rendered["example"], "Service", "kvguardian-guard")
    pod_labels = one(rendered["example"], "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert monitor["namespaceSelector"] == {"any": True}
    assert monitor["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert service["spec"]["selector"].items() <= pod_labels.items() and service["spec"]["clusterIP"] == "None"
    assert {e["port"] for e in monitor["endpoints"]} == {p["name"] for p in service["spec"]["ports"]}
    for endpoint in monitor["endpoints"]:
        copied = {r["targetLabel"]: r["sourceLabels"] for r in endpoint["relabelings"]}
        assert copied == {"model": ["__meta_kubernetes_pod_label_kvguardian_dev_model"],
                          "tenant": ["__meta_kubernetes_pod_label_kvguardian_dev_tenant"]}
    assert pod_labels[manifests.MODEL]  # the example names its model


def test_no_object_asks_for_api_access(rendered):
    """Least privilege: nothing kv-guardian runs calls the Kubernetes API, so no Role or binding exists and no
    token is mounted where kv-guardian owns the pod."""
    docs = all_docs(rendered)
    assert not [d for d in docs if d["kind"] in ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")]
    for account in (d for d in docs if d["kind"] == "ServiceAccount"):
        assert account["automountServiceAccountToken"] is False
    plugin = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    assert plugin["automountServiceAccountToken"] is False
    assert plugin["serviceAccountName"] == one(docs, "ServiceAccount")["metadata"]["name"]


def test_every_container_has_resources_probes_and_a_locked_down_security_context(rendered):
    pods = [d["spec"]["template"]["spec"] for d in all_docs(rendered) if d["kind"] in ("Deployment", "DaemonSet")]
    containers = [c for pod in pods for c in pod["containers"] + pod.get("initContainers", [])]
    assert len(containers) == 3
    for c in containers:
        assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"], c["name"]
        assert c["resources"]["limits"]["memory"], c["name"]
        assert "livenessProbe" in c and ("readinessProbe" in c or "startupProbe" in c), c["name"]
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}, c["name"]
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}, c["name"]
        assert not sc.get("privileged"), c["name"]


def test_device_plugin_daemonset_mounts_the_kubelet_socket_dir_and_probes_its_socket(rendered):
    ds = one(rendered["platform"], "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["command"][:2] == ["kv-guardian", "device-plugin"]
    assert {"name": "device-plugins", "mountPath": "/var/lib/kubelet/device-plugins"} in c["volumeMounts"]
    assert pod["volumes"][0]["hostPath"]["path"] == "/var/lib/kubelet/device-plugins"
    import inspect

    from kvguardian.ops.k8s.plugin import PluginServer

    endpoint = inspect.signature(PluginServer).parameters["endpoint"].default  # the CLI's default too
    assert c["livenessProbe"]["exec"]["command"] == ["test", "-S", f"/var/lib/kubelet/device-plugins/{endpoint}"]
