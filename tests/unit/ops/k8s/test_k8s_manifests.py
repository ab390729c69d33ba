"""deploy/k8s validated offline: generated files are up to date, core kinds pass kubernetes-validate (strict:
unknown fields fail) for the oldest Kubernetes with native sidecars and the newest bundled, CRD kinds pass
the prometheus-operator schemas kept in deploy/k8s/schemas (made strict the same way), the PrometheusRule is
the rules file, and the pod wires readiness, preStop and the grace period together."""

import copy
import json

import pytest
import yaml

from kvg_testing import ROOT

kubernetes_validate = pytest.importorskip("kubernetes_validate")
jsonschema = pytest.importorskip("jsonschema")

from kvguardian.ops.k8s import manifests  # noqa: E402

K8S = ROOT / "deploy" / "k8s"
VERSIONS = ("1.29.0", kubernetes_validate.latest_version())  # 1.29: native sidecars (restartPolicy: Always)


def docs(name):
    return list(yaml.safe_load_all((K8S / name).read_text()))


def all_docs():
    return [d for name in manifests.documents() for d in docs(name)]


def test_committed_manifests_are_what_the_generator_writes(tmp_path):
    assert manifests.main(["--check"]) == 0
    assert manifests.main(["--out", str(tmp_path)]) == 0
    for name in manifests.documents():
        assert (tmp_path / name).read_text() == (K8S / name).read_text()
    (tmp_path / "inference.yaml").write_text("stale")
    assert manifests.main(["--check", "--out", str(tmp_path)]) == 1


CORE = ("Deployment", "Service", "DaemonSet")


@pytest.mark.parametrize("version", VERSIONS)
def test_core_kinds_pass_kubernetes_validate_strict(version):
    core = [d for d in all_docs() if d["kind"] in CORE]
    assert sorted(d["kind"] for d in core) == ["DaemonSet", "Deployment", "Service"]
    for d in core:
        kubernetes_validate.validate(d, version, strict=True)


def test_strict_validation_catches_an_unknown_field_and_a_wrong_type():
    dep = next(d for d in all_docs() if d["kind"] == "Deployment")
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


@pytest.mark.parametrize("kind", ["ServiceMonitor", "PrometheusRule"])
def test_crd_kinds_pass_their_schemas_and_a_typo_fails(kind):
    doc = next(d for d in all_docs() if d["kind"] == kind)
    assert doc["apiVersion"] == "monitoring.coreos.com/v1"
    v = crd_validator(kind)
    assert list(v.iter_errors(doc)) == []
    bad = copy.deepcopy(doc)
    if kind == "ServiceMonitor":
        bad["spec"]["endpoints"][0]["intervall"] = "15s"
    else:
        bad["spec"]["groups"][0]["rules"][0]["exp"] = "up"
    assert list(v.iter_errors(bad))


def test_prometheus_rule_is_the_rules_file():
    rule = next(d for d in all_docs() if d["kind"] == "PrometheusRule")
    source = yaml.safe_load((ROOT / "deploy" / "prometheus" / "kvguardian-rules.yml").read_text())
    assert rule["spec"] == {"groups": source["groups"]}


def test_the_pod_wires_readiness_prestop_and_the_grace_period():
    dep = next(d for d in all_docs() if d["kind"] == "Deployment")
    pod = dep["spec"]["template"]["spec"]
    (sidecar,) = pod["initContainers"]
    (server,) = pod["containers"]
    assert sidecar["restartPolicy"] == "Always" and sidecar["command"][:2] == ["kv-guardian", "oom-guard"]
    port = next(p["containerPort"] for p in sidecar["ports"] if p["name"] == "guard")
    assert sidecar["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "guard"}
    deadline = float(sidecar["command"][sidecar["command"].index("--drain-deadline") + 1])
    hook = server["lifecycle"]["preStop"]["httpGet"]
    assert hook["port"] == port and hook["path"] == f"/drain?deadline={deadline:g}"
    assert pod["terminationGracePeriodSeconds"] > deadline
    for c in (sidecar, server):
        assert c["resources"]["limits"]["memory"] and c["resources"]["requests"]
    assert server["resources"]["limits"][manifests.RESOURCE] == server["resources"]["requests"][manifests.RESOURCE]
    assert "KVG_KV_BUDGET_MB" in server["command"][-1]
    assert "--host" in sidecar["command"] and "0.0.0.0" in sidecar["command"]  # probes come from the kubelet


def test_device_plugin_daemonset_mounts_the_kubelet_socket_dir():
    ds = next(d for d in all_docs() if d["kind"] == "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["command"][:2] == ["kv-guardian", "device-plugin"]
    assert {"name": "device-plugins", "mountPath": "/var/lib/kubelet/device-plugins"} in c["volumeMounts"]
    assert pod["volumes"][0]["hostPath"]["path"] == "/var/lib/kubelet/device-plugins"
