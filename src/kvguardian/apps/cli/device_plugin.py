"""``kv-guardian device-plugin``: advertise KV-cache budgets as a Kubernetes extended resource.

    kv-guardian device-plugin                         # chunks of 256 MiB from every GPU NVML sees
    kv-guardian device-plugin --reserve-mb 8192       # keep 8 GiB per GPU for weights and activations
    kv-guardian device-plugin --total-mb 65536        # a configured size (no NVML needed)
    kv-guardian device-plugin --once                  # print what it would advertise, as JSON

Pods request ``kvguardian.dev/kv-cache-256mi: N`` and get ``KVG_KV_BUDGET_MB`` (and ``NV_GPU_KV_CACHE_MB``)
= N x 256 in their environment. It schedules and hands out budgets; it does not isolate GPU memory (see
docs/kv-budgets.md). Exit codes: 2 for bad input, 3 when NVML or the kubelet is missing.
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from kvguardian.apps.cli.options import add_duration_option
from kvguardian.core.errors import EXIT_OK

if TYPE_CHECKING:
    from kvguardian.ops.oom.signals.nvml import Nvml

NAME = "device-plugin"
HELP = "Kubernetes device plugin: advertise KV-cache budgets (chunks of GPU memory) and inject them on Allocate"
EXAMPLE = "kv-guardian device-plugin --total-mb 40960 --chunk-mb 256"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--chunk-mb", type=int, default=256, help="MiB per advertised unit (default 256)")
    p.add_argument("--total-mb", type=int, help="advertise this many MiB for the node instead of sizing from NVML")
    p.add_argument("--reserve-mb", type=int, default=0,
                   help="MiB per GPU kept out of the KV budget (weights, activations, CUDA context)")
    p.add_argument("--resource", help="extended resource name (default kvguardian.dev/kv-cache-<chunk>mi)")
    p.add_argument("--socket-dir", default="/var/lib/kubelet/device-plugins", help="the kubelet's device-plugin dir")
    p.add_argument("--kubelet-socket", default="kubelet.sock", help="the kubelet's registration socket (file name)")
    p.add_argument("--endpoint", default="kvguardian-kv-cache.sock", help="this plugin's socket (file name)")
    p.add_argument("--once", action="store_true", help="print the chunks and resource as JSON and exit")
    add_duration_option(p)


def _gpu_mb(args: argparse.Namespace) -> tuple[list[int], Nvml | None]:
    """Per-GPU MiB from NVML (and the module, for health); empty with --total-mb when NVML is absent."""
    from kvguardian.ops.oom.signals.base import SignalUnavailable
    from kvguardian.ops.oom.signals.nvml import device_memory, load_nvml

    try:
        nvml = load_nvml()
        return [b >> 20 for b in device_memory(nvml)], nvml
    except SignalUnavailable:
        if args.total_mb is not None:
            return [], None
        raise


def _health(nvml: Nvml) -> Callable[[], set[int | None]]:
    def unhealthy() -> set[int | None]:
        bad: set[int | None] = set()
        for i in range(int(nvml.nvmlDeviceGetCount())):
            try:
                nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(i))
            except Exception:
                bad.add(i)
        return bad

    return unhealthy


def run(args: argparse.Namespace) -> int:
    from kvguardian.ops.k8s.plugin import KVCachePlugin, PluginServer, check_resource_name, plan_chunks, resource_name

    gpu_mb, nvml = _gpu_mb(args)
    chunks = plan_chunks(args.chunk_mb, gpu_mb=gpu_mb, total_mb=args.total_mb, reserve_mb=args.reserve_mb)
    resource = check_resource_name(args.resource or resource_name(args.chunk_mb))
    if args.once:
        print(json.dumps({"resource": resource, "chunk_mb": args.chunk_mb, "chunks": len(chunks),
                          "budget_mb": len(chunks) * args.chunk_mb, "gpus_mb": gpu_mb,
                          "devices": [{"id": c.id, "gpu": c.gpu} for c in chunks]}, indent=2))
        return EXIT_OK
    plugin = KVCachePlugin(chunks, args.chunk_mb)
    server = PluginServer(plugin, resource, socket_dir=args.socket_dir, endpoint=args.endpoint,
                          kubelet_socket=args.kubelet_socket)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    timer = threading.Timer(args.duration, stop.set) if args.duration is not None else None
    if timer is not None:
        timer.daemon = True
        timer.start()
    server.start()
    try:
        server.register()
        print(f"kv-guardian device-plugin: {resource}: {len(chunks)} x {args.chunk_mb} MiB on {server.path}",
              flush=True)
        server.watch(stop, health=_health(nvml) if nvml is not None else None)
    finally:
        if timer is not None:
            timer.cancel()
        server.stop()
    return EXIT_OK
