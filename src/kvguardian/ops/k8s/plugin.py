"""``kv-guardian device-plugin``: a Kubernetes device plugin that hands each pod a KV-cache budget.

It speaks the kubelet's device-plugin API v1beta1 over gRPC (`kvguardian.ops.k8s.api`) and advertises KV-cache
memory in chunks (``kvguardian.dev/kv-cache-256mi``); ``Allocate`` injects the budget as ``KVG_KV_BUDGET_MB``
(and ``NV_GPU_KV_CACHE_MB``), which `kvguardian.ops.oom.budget` reads. It schedules budgets but cannot isolate GPU
memory: see docs/kv-budgets.md and docs/design/k8s.md.
"""

from __future__ import annotations

import importlib
import logging
import os
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvguardian.core.errors import EXIT_ENVIRONMENT, UsageError
from kvguardian.ops.oom.budget import ALIAS, ENV

if TYPE_CHECKING:
    import grpc

    from kvguardian.ops.k8s.api import deviceplugin_pb2 as pb2

__all__ = [
    "DEFAULT_DOMAIN",
    "HEALTHY",
    "UNHEALTHY",
    "Chunk",
    "KVCachePlugin",
    "PluginServer",
    "plan_chunks",
    "resource_name",
]

log = logging.getLogger("kvguardian.k8s")

API_VERSION = "v1beta1"
DEFAULT_DOMAIN = "kvguardian.dev"
HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"
GPUS_ENV = "KVG_KV_GPUS"  # the GPU indices the budget's chunks come from (advisory)
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[a-z0-9]([-a-z0-9_.]*[a-z0-9])?")


def resource_name(chunk_mb: int, domain: str = DEFAULT_DOMAIN) -> str:
    return f"{domain}/kv-cache-{chunk_mb}mi"


def check_resource_name(name: str) -> str:
    if not _NAME.fullmatch(name) or len(name) > 253:
        raise UsageError(f"--resource {name!r} is not an extended resource name; fix: domain/name, e.g. "
                         f"{resource_name(256)}")
    domain = name.split("/", 1)[0]
    if domain == "kubernetes.io" or domain.endswith(".kubernetes.io"):
        raise UsageError(f"--resource {name!r}: the kubernetes.io domain is reserved; fix: your own domain")
    return name


@dataclass(frozen=True)
class Chunk:
    """One advertised device: ``chunk_mb`` MiB of KV budget, from GPU ``gpu`` (None: a configured size)."""

    id: str
    gpu: int | None


def plan_chunks(chunk_mb: int, *, gpu_mb: Sequence[int] = (), total_mb: int | None = None,
                reserve_mb: int = 0) -> list[Chunk]:
    """The chunks to advertise: per GPU (its memory less ``reserve_mb`` for weights and activations), or
    ``total_mb`` for the node when given (checked against the GPUs' sum when they are known).

    Raises:
        UsageError: a chunk or total of 0, a total larger than the devices, or nothing left to advertise.
    """
    if chunk_mb <= 0:
        raise UsageError(f"--chunk-mb {chunk_mb}: a chunk must be at least 1 MiB; fix: e.g. --chunk-mb 256")
    if reserve_mb < 0:
        raise UsageError(f"--reserve-mb {reserve_mb} is negative; fix: 0 or more")
    if total_mb is not None:
        if total_mb <= 0:
            raise UsageError(f"--total-mb {total_mb}: a KV budget of {total_mb} MiB advertises nothing; fix: a "
                             "positive size, or leave it out to size from NVML")
        if gpu_mb and total_mb > sum(gpu_mb):
            raise UsageError(f"--total-mb {total_mb} is larger than the node's GPU memory ({sum(gpu_mb)} MiB over "
                             f"{len(gpu_mb)} GPU(s)); fix: at most {sum(gpu_mb)} less what weights need")
        chunks = [Chunk(f"kv-node-{k:05d}", None) for k in range(total_mb // chunk_mb)]
    else:
        chunks = [Chunk(f"kv-gpu{g}-{k:05d}", g) for g, mb in enumerate(gpu_mb)
                  for k in range(max(mb - reserve_mb, 0) // chunk_mb)]
    if not chunks:
        raise UsageError(f"no {chunk_mb} MiB chunk fits (GPUs {list(gpu_mb)} MiB, reserve {reserve_mb} MiB, total "
                         f"{total_mb}); fix: a smaller --chunk-mb or --reserve-mb")
    return chunks


def _pb() -> tuple[Any, Any]:
    from kvguardian.core.errors import require

    require("grpc", "k8s")
    try:  # by module name: a missing file is then ModuleNotFoundError naming it (not "cannot import name")
        deviceplugin_pb2 = importlib.import_module("kvguardian.ops.k8s.api.deviceplugin_pb2")
        deviceplugin_pb2_grpc = importlib.import_module("kvguardian.ops.k8s.api.deviceplugin_pb2_grpc")
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("kvguardian.ops.k8s.api."):
            raise
        # setup.py generates them from deviceplugin.proto when kv-guardian is built; a source tree not installed
        # (or cleaned since) has only the .proto
        raise UsageError("kvguardian.ops.k8s.api has no generated gRPC modules (kv-guardian's build makes them from "
                         "deviceplugin.proto); fix: reinstall it (./scripts/setup.sh, or pip install -e .)",
                         exit_code=EXIT_ENVIRONMENT) from exc
    return deviceplugin_pb2, deviceplugin_pb2_grpc


class KVCachePlugin:
    """The DevicePlugin service (registered on a grpc server by `PluginServer`)."""

    def __init__(self, chunks: Sequence[Chunk], chunk_mb: int, *, env_names: Sequence[str] = (ENV, ALIAS)) -> None:
        self.pb, _ = _pb()
        self.chunks = {c.id: c for c in chunks}
        self.chunk_mb = chunk_mb
        self.env_names = tuple(env_names)
        self.unhealthy: set[int | None] = set()
        self.allocations = 0
        self._changed = threading.Condition()
        self._version = 0
        self.stopping = threading.Event()

    def set_unhealthy(self, gpus: set[int | None]) -> None:
        """Mark the chunks of these GPUs unhealthy (the rest healthy); ListAndWatch streams the change."""
        with self._changed:
            if gpus != self.unhealthy:
                self.unhealthy = set(gpus)
                self._version += 1
                self._changed.notify_all()

    def devices(self) -> list[Any]:
        pb = self.pb
        return [pb.Device(ID=c.id, health=UNHEALTHY if c.gpu in self.unhealthy else HEALTHY)
                for c in self.chunks.values()]

    # ------------------------------------------------------------------ the gRPC service
    def GetDevicePluginOptions(self, request: pb2.Empty | None, context: grpc.ServicerContext | None) -> Any:
        return self.pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

    def ListAndWatch(self, request: pb2.Empty, context: grpc.ServicerContext) -> Iterator[Any]:
        seen = -1
        while not self.stopping.is_set() and context.is_active():
            with self._changed:
                if seen == self._version:
                    self._changed.wait(0.5)
                    continue
                seen = self._version
                devices = self.devices()
            yield self.pb.ListAndWatchResponse(devices=devices)

    def GetPreferredAllocation(self, request: pb2.PreferredAllocationRequest, context: grpc.ServicerContext) -> Any:
        pb = self.pb
        out = []
        for req in request.container_requests:
            out.append(pb.ContainerPreferredAllocationResponse(deviceIDs=self.prefer(
                list(req.available_deviceIDs), list(req.must_include_deviceIDs), int(req.allocation_size))))
        return pb.PreferredAllocationResponse(container_responses=out)

    def prefer(self, available: list[str], must: list[str], size: int) -> list[str]:
        """The ``must`` ids, then chunks of the GPU they are on (or of the GPU with most chunks free)."""
        chosen = list(dict.fromkeys(must))[:size]
        free = [i for i in available if i not in chosen and i in self.chunks]
        by_gpu: dict[int | None, list[str]] = {}
        for i in free:
            by_gpu.setdefault(self.chunks[i].gpu, []).append(i)
        first = {self.chunks[i].gpu for i in chosen if i in self.chunks}
        order = sorted(by_gpu, key=lambda g: (g not in first, -len(by_gpu[g]), -1 if g is None else g))
        for g in order:
            for i in by_gpu[g]:
                if len(chosen) >= size:
                    return chosen
                chosen.append(i)
        return chosen

    def Allocate(self, request: pb2.AllocateRequest, context: grpc.ServicerContext) -> Any:
        import grpc

        pb = self.pb
        out = []
        for req in request.container_requests:
            ids = list(req.devices_ids)
            unknown = [i for i in ids if i not in self.chunks]
            if unknown:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              f"unknown device ids {unknown[:4]}; this plugin advertises {len(self.chunks)} chunks")
            mb = str(len(ids) * self.chunk_mb)
            gpus = sorted({str(self.chunks[i].gpu) for i in ids if self.chunks[i].gpu is not None})
            envs = dict.fromkeys(self.env_names, mb)
            if gpus:
                envs[GPUS_ENV] = ",".join(gpus)
            out.append(pb.ContainerAllocateResponse(envs=envs, annotations={f"{DEFAULT_DOMAIN}/kv-cache-mb": mb}))
            self.allocations += 1
            log.info("kv-guardian device-plugin: allocated %s chunk(s): %s MiB KV budget", len(ids), mb)
        return pb.AllocateResponse(container_responses=out)

    def PreStartContainer(self, request: pb2.PreStartContainerRequest, context: grpc.ServicerContext) -> Any:
        return self.pb.PreStartContainerResponse()


class PluginServer:
    """Serve a `KVCachePlugin` on ``socket_dir/endpoint`` and register it with the kubelet.

    When the kubelet restarts it removes every plugin socket and recreates ``kubelet.sock``; `watch` then
    serves again and re-registers.
    """

    def __init__(self, plugin: KVCachePlugin, resource: str, *,
                 socket_dir: Path | str = "/var/lib/kubelet/device-plugins",
                 endpoint: str = "kvguardian-kv-cache.sock", kubelet_socket: str = "kubelet.sock") -> None:
        if "/" in endpoint or not endpoint:
            raise UsageError(f"--endpoint {endpoint!r} must be a file name inside the socket directory")
        self.plugin = plugin
        self.resource = check_resource_name(resource)
        self.dir = Path(socket_dir)
        if not self.dir.is_dir():
            raise UsageError(f"--socket-dir {self.dir} does not exist; fix: mount the kubelet's device-plugin "
                             "directory (/var/lib/kubelet/device-plugins) there")
        self.endpoint = endpoint
        self.path = self.dir / endpoint
        self.kubelet = self.dir / kubelet_socket
        self.server: Any = None
        self.registrations = 0
        self._kubelet_id: tuple[int, int] | None = None

    def start(self) -> None:
        import grpc

        _, pbg = _pb()
        if self.path.exists():
            self.path.unlink()  # a stale socket of an earlier run
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        pbg.add_DevicePluginServicer_to_server(self.plugin, self.server)
        self.server.add_insecure_port(f"unix://{self.path}")
        self.server.start()

    def register(self, timeout: float = 10.0) -> None:
        """``Registration.Register`` on the kubelet's socket.

        Raises:
            UsageError: no kubelet socket, or the kubelet refused (another plugin holds the resource name).
        """
        import grpc

        pb, pbg = _pb()
        if not self.kubelet.exists():
            raise UsageError(f"no kubelet socket at {self.kubelet}; fix: run on a node, with the device-plugin "
                             "directory mounted", exit_code=3)
        opts = self.plugin.GetDevicePluginOptions(None, None)
        with grpc.insecure_channel(f"unix://{self.kubelet}") as ch:
            try:
                pbg.RegistrationStub(ch).Register(pb.RegisterRequest(
                    version=API_VERSION, endpoint=self.endpoint, resource_name=self.resource, options=opts),
                    timeout=timeout)
            except grpc.RpcError as exc:
                raise UsageError(f"the kubelet refused to register {self.resource}: {exc.code().name}: "
                                 f"{exc.details()}", exit_code=3) from None
        st = self.kubelet.stat()
        self._kubelet_id = (st.st_ino, st.st_mtime_ns)
        self.registrations += 1
        log.info("kv-guardian device-plugin: registered %s (%d chunks) at %s", self.resource,
                 len(self.plugin.chunks), self.path)

    def watch(self, stop: threading.Event, *, every: float = 1.0,
              health: Callable[[], set[int | None]] | None = None) -> None:
        """Until ``stop``: re-serve and re-register after a kubelet restart; refresh chunk health."""
        while not stop.wait(every):
            if health is not None:
                try:
                    self.plugin.set_unhealthy(health())
                except Exception as exc:  # a failing health probe must not stop the plugin
                    log.warning("kv-guardian device-plugin: health check failed: %s", exc)
            try:
                st = self.kubelet.stat()
            except FileNotFoundError:
                continue  # the kubelet is restarting
            if not self.path.exists() or (st.st_ino, st.st_mtime_ns) != self._kubelet_id:
                log.warning("kv-guardian device-plugin: the kubelet restarted; serving and registering again")
                self.stop()
                self.start()
                try:
                    self.register()
                except UsageError as exc:
                    log.warning("kv-guardian device-plugin: %s; retrying", exc)

    def stop(self) -> None:
        self.plugin.stopping.set()
        if self.server is not None:
            self.server.stop(grace=1).wait(2)
            self.server = None
        self.plugin.stopping.clear()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
