"""The device-plugin .proto: the modules the build generated (setup.py) are what grpcio-tools makes from it now, and its
wire contract (package, services, field numbers) is the kubelet's v1beta1."""

import shutil
import subprocess
import sys

import pytest

from kvg_testing import ROOT

pytest.importorskip("grpc")
API = ROOT / "src" / "kvguardian" / "ops" / "k8s" / "api"


def test_generated_modules_match_the_proto(tmp_path):
    pytest.importorskip("grpc_tools")
    dst = tmp_path / "kvguardian" / "ops" / "k8s" / "api"
    dst.mkdir(parents=True)
    shutil.copy(API / "deviceplugin.proto", dst)
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I", str(tmp_path), f"--python_out={tmp_path}",
                    f"--grpc_python_out={tmp_path}", f"--pyi_out={tmp_path}",
                    str(dst / "deviceplugin.proto")], check=True)
    for name in ("deviceplugin_pb2.py", "deviceplugin_pb2_grpc.py", "deviceplugin_pb2.pyi"):
        assert (dst / name).read_text() == (API / name).read_text(), f"{name} is stale; reinstall (./scripts/setup.sh)"


# (message, field) -> number, from k8s.io/kubelet pkg/apis/deviceplugin/v1beta1/api.proto
WIRE = {
    ("DevicePluginOptions", "pre_start_required"): 1, ("DevicePluginOptions", "get_preferred_allocation_available"): 2,
    ("RegisterRequest", "version"): 1, ("RegisterRequest", "endpoint"): 2, ("RegisterRequest", "resource_name"): 3,
    ("RegisterRequest", "options"): 4, ("ListAndWatchResponse", "devices"): 1, ("Device", "ID"): 1,
    ("Device", "health"): 2, ("Device", "topology"): 3, ("TopologyInfo", "nodes"): 1, ("NUMANode", "ID"): 1,
    ("PreStartContainerRequest", "devices_ids"): 1, ("PreferredAllocationRequest", "container_requests"): 1,
    ("ContainerPreferredAllocationRequest", "available_deviceIDs"): 1,
    ("ContainerPreferredAllocationRequest", "must_include_deviceIDs"): 2,
    ("ContainerPreferredAllocationRequest", "allocation_size"): 3,
    ("PreferredAllocationResponse", "container_responses"): 1, ("ContainerPreferredAllocationResponse", "deviceIDs"): 1,
    ("AllocateRequest", "container_requests"): 1, ("ContainerAllocateRequest", "devices_ids"): 1,
    ("AllocateResponse", "container_responses"): 1, ("ContainerAllocateResponse", "envs"): 1,
    ("ContainerAllocateResponse", "mounts"): 2, ("ContainerAllocateResponse", "devices"): 3,
    ("ContainerAllocateResponse", "annotations"): 4, ("ContainerAllocateResponse", "cdi_devices"): 5,
    ("Mount", "container_path"): 1, ("Mount", "host_path"): 2, ("Mount", "read_only"): 3,
    ("DeviceSpec", "container_path"): 1, ("DeviceSpec", "host_path"): 2, ("DeviceSpec", "permissions"): 3,
    ("CDIDevice", "name"): 1,
}


def test_wire_contract_is_the_kubelets_v1beta1():
    from kvguardian.ops.k8s.api import deviceplugin_pb2 as pb

    d = pb.DESCRIPTOR
    assert d.package == "v1beta1"
    for (msg, field), number in WIRE.items():
        assert d.message_types_by_name[msg].fields_by_name[field].number == number, (msg, field)
    methods = {s.name: [m.name for m in s.methods] for s in d.services_by_name.values()}
    assert methods == {"Registration": ["Register"], "DevicePlugin": [
        "GetDevicePluginOptions", "ListAndWatch", "GetPreferredAllocation", "Allocate", "PreStartContainer"]}
    from google.protobuf import descriptor_pb2

    fdp = descriptor_pb2.FileDescriptorProto()
    d.CopyToProto(fdp)
    streams = {m.name: (m.client_streaming, m.server_streaming) for s in fdp.service for m in s.method}
    assert streams["ListAndWatch"] == (False, True)
    assert {v for k, v in streams.items() if k != "ListAndWatch"} == {(False, False)}


def test_missing_generated_modules_are_one_line_naming_the_fix(monkeypatch, tmp_path):
    import kvguardian.ops.k8s.api as api
    from kvguardian.core.errors import EXIT_ENVIRONMENT, UsageError
    from kvguardian.ops.k8s import plugin

    for name in ("__init__.py", "deviceplugin.proto"):  # the package as a source tree that was never built has it
        shutil.copy(API / name, tmp_path)
    monkeypatch.setattr(api, "__path__", [str(tmp_path)])
    for name in ("deviceplugin_pb2", "deviceplugin_pb2_grpc"):
        monkeypatch.delitem(sys.modules, f"kvguardian.ops.k8s.api.{name}", raising=False)
        monkeypatch.delattr(api, name, raising=False)
    with pytest.raises(UsageError) as info:
        plugin._pb()
    assert info.value.exit_code == EXIT_ENVIRONMENT
    assert "deviceplugin.proto" in str(info.value) and "fix: reinstall" in str(info.value)
