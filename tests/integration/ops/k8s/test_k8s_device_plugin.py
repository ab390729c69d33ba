"""The device plugin over real gRPC unix sockets, with the test playing the kubelet: a Registration server
on kubelet.sock in a temporary directory, then ListAndWatch, GetPreferredAllocation and Allocate against
the plugin's socket, and the budget it injects read by a guard."""

import os
import subprocess
import sys
import threading
import time
from concurrent import futures

import pytest

from kvg_testing import ROOT

grpc = pytest.importorskip("grpc")

from kvguardian.ops.k8s.plugin import KVCachePlugin, PluginServer, _pb, plan_chunks, resource_name  # noqa: E402

pb, pbg = _pb()  # the modules the build generates; without them, one line naming the fix (reinstall)


class FakeKubelet(pbg.RegistrationServicer):
    """The kubelet's Registration service on ``dir/kubelet.sock``."""

    def __init__(self, directory):
        self.dir = directory
        self.requests = []
        self.got = threading.Event()
        self.server = None
        self.start()

    def start(self):
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        pbg.add_RegistrationServicer_to_server(self, self.server)
        self.server.add_insecure_port(f"unix://{self.dir / 'kubelet.sock'}")
        self.server.start()

    def stop(self):
        self.server.stop(0).wait()
        sock = self.dir / "kubelet.sock"
        if sock.exists():
            sock.unlink()

    def Register(self, request, context):
        self.requests.append(request)
        self.got.set()
        return pb.Empty()

    def plugin(self, endpoint):
        return pbg.DevicePluginStub(grpc.insecure_channel(f"unix://{self.dir / endpoint}"))


@pytest.fixture
def kubelet(tmp_path):
    k = FakeKubelet(tmp_path)
    yield k
    k.stop()


@pytest.fixture
def plugin_server(kubelet):
    chunks = plan_chunks(256, gpu_mb=[4096, 2048], reserve_mb=1024)  # 12 + 4 chunks
    server = PluginServer(KVCachePlugin(chunks, 256), resource_name(256), socket_dir=kubelet.dir)
    server.start()
    yield server
    server.stop()


def test_register_list_and_watch_allocate_and_a_guard_reads_the_budget(kubelet, plugin_server):
    plugin_server.register()
    (req,) = kubelet.requests
    assert (req.version, req.endpoint, req.resource_name) == ("v1beta1", "kvguardian-kv-cache.sock",
                                                              "kvguardian.dev/kv-cache-256mi")
    assert req.options.get_preferred_allocation_available and not req.options.pre_start_required
    stub = kubelet.plugin(req.endpoint)
    opts = stub.GetDevicePluginOptions(pb.Empty(), timeout=5)
    assert opts.get_preferred_allocation_available
    stream = stub.ListAndWatch(pb.Empty(), timeout=10)
    first = next(stream)
    ids = [d.ID for d in first.devices]
    assert len(ids) == 16 and {d.health for d in first.devices} == {"Healthy"}
    plugin_server.plugin.set_unhealthy({1})  # GPU 1 went bad: the stream sends the new list
    second = next(stream)
    assert sum(d.health == "Unhealthy" for d in second.devices) == 4
    stream.cancel()

    pref = stub.GetPreferredAllocation(pb.PreferredAllocationRequest(container_requests=[
        pb.ContainerPreferredAllocationRequest(available_deviceIDs=ids, must_include_deviceIDs=["kv-gpu1-00000"],
                                               allocation_size=3)]), timeout=5)
    chosen = list(pref.container_responses[0].deviceIDs)
    assert chosen[0] == "kv-gpu1-00000" and all(i.startswith("kv-gpu1-") for i in chosen) and len(chosen) == 3

    resp = stub.Allocate(pb.AllocateRequest(container_requests=[
        pb.ContainerAllocateRequest(devices_ids=ids[:8])]), timeout=5)
    envs = dict(resp.container_responses[0].envs)
    assert envs == {"KVG_KV_BUDGET_MB": "2048", "NV_GPU_KV_CACHE_MB": "2048", "KVG_KV_GPUS": "0"}
    assert stub.PreStartContainer(pb.PreStartContainerRequest(devices_ids=ids[:8]), timeout=5) is not None

    # the container's guard reads what the plugin injected
    from kvguardian.ops.oom.budget import kv_budget
    from kvguardian.ops.oom.guard import OOMGuard
    from kvguardian.runtime.guard import Guard

    budget = kv_budget(env=envs)
    guard = Guard()
    oom = OOMGuard().watch_guard(guard, budget_bytes=budget.nbytes, budget_source=budget.source, hf_hook=False)
    oom.sample()
    (reading,) = oom.readings
    assert (reading.signal, reading.limit) == ("kv_budget", 2048 << 20) and "KVG_KV_BUDGET_MB" in reading.source


def test_allocate_of_unknown_ids_is_invalid_argument(kubelet, plugin_server):
    plugin_server.register()
    stub = kubelet.plugin("kvguardian-kv-cache.sock")
    with pytest.raises(grpc.RpcError) as err:
        stub.Allocate(pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=["gpu-9"])]),
                      timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "unknown device ids" in err.value.details()


def test_a_kubelet_restart_is_followed_by_a_new_registration(kubelet, plugin_server):
    plugin_server.register()
    stop = threading.Event()
    watcher = threading.Thread(target=plugin_server.watch, args=(stop,), kwargs={"every": 0.05}, daemon=True)
    watcher.start()
    try:
        kubelet.stop()  # the kubelet goes away, removes the plugins' sockets, and comes back
        plugin_server.path.unlink()
        kubelet.got.clear()
        time.sleep(0.1)
        kubelet.start()
        assert kubelet.got.wait(10) and len(kubelet.requests) == 2
        stub = kubelet.plugin("kvguardian-kv-cache.sock")
        assert stub.GetDevicePluginOptions(pb.Empty(), timeout=5).get_preferred_allocation_available
    finally:
        stop.set()
        watcher.join(5)


def test_the_cli_registers_with_a_configured_size(kubelet):
    proc = subprocess.Popen([sys.executable, "-m", "kvguardian", "device-plugin", "--total-mb", "1024",
                             "--socket-dir", str(kubelet.dir), "--duration", "20"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert kubelet.got.wait(30), proc.stderr.read() if proc.poll() is not None else "no registration"
        stub = kubelet.plugin(kubelet.requests[0].endpoint)
        first = next(stub.ListAndWatch(pb.Empty(), timeout=10))
        assert [d.ID for d in first.devices] == [f"kv-node-{k:05d}" for k in range(4)]
        resp = stub.Allocate(pb.AllocateRequest(container_requests=[
            pb.ContainerAllocateRequest(devices_ids=["kv-node-00000", "kv-node-00001"])]), timeout=5)
        assert dict(resp.container_responses[0].envs)["KVG_KV_BUDGET_MB"] == "512"
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert "kvguardian.dev/kv-cache-256mi: 4 x 256 MiB" in out


@pytest.mark.parametrize(("args", "code", "message"), [
    (["--total-mb", "0"], 2, "advertises nothing"),
    (["--total-mb", "1024", "--chunk-mb", "0"], 2, "at least 1 MiB"),
    (["--total-mb", "100"], 2, "no 256 MiB chunk fits"),
    (["--total-mb", "1024", "--resource", "kubernetes.io/kv"], 2, "reserved"),
    (["--total-mb", "1024", "--socket-dir", "/nonexistent-kvg"], 2, "does not exist"),
])
def test_bad_input_is_one_line_and_an_exit_code(kv_cli, args, code, message):
    rc, _, err = kv_cli("device-plugin", *args, timeout=60)
    assert rc == code and message in err and err.count("\n") == 1 and "Traceback" not in err


def test_no_kubelet_socket_is_a_clear_environment_error(kv_cli, tmp_path):
    rc, _, err = kv_cli("device-plugin", "--total-mb", "1024", "--socket-dir", str(tmp_path), timeout=60)
    assert rc == 3 and "no kubelet socket" in err
