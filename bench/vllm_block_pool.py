"""Load vLLM's own ``BlockPool`` from a vLLM distribution fetched at bench time (no vLLM code is kept here).

``vllm/v1/core/block_pool.py`` imports a few vLLM modules (engine config, logging, metrics, KV events,
multimodal helpers, the request class). This module extracts the real block pool, its ``kv_cache_utils``
(blocks, the free-block queue, block hashing) and ``vllm.utils.hashing`` / ``math_utils`` from the
distribution into a temporary directory, and writes stubs for only what those imports need: names that the
block pool's paths measured here never call (or, for ``cbor2``, a third-party module that only the CBOR
hash functions use). The measured code is vLLM's, unchanged.

The distribution is fetched with ``pip download --no-deps --only-binary :all: vllm==VERSION`` (the wheel:
pip cannot download vLLM's sdist without preparing its metadata, which installs torch==2.14 and cmake as
build dependencies); ``--vllm-from PATH`` takes an already downloaded wheel, sdist (``.tar.gz``) or an
unpacked source tree instead.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

__all__ = ["VllmPool", "fetch", "load"]

REAL = (
    "vllm/v1/core/block_pool.py",
    "vllm/v1/core/kv_cache_utils.py",
    "vllm/utils/hashing.py",
    "vllm/utils/math_utils.py",
)

_EVENTS = """MEDIUM_GPU = "GPU"


class KVCacheEvent:
    def __init__(self, **fields):
        self.__dict__.update(fields)


class BlockStored(KVCacheEvent):
    pass


class BlockRemoved(KVCacheEvent):
    pass


class AllBlocksCleared(KVCacheEvent):
    pass
"""

STUBS = {
    "vllm/__init__.py": "",
    "vllm/envs.py": "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES = False\n",
    "vllm/config/__init__.py": "class VllmConfig:\n    pass\n",
    "vllm/logger.py": "import logging\n\n\ndef init_logger(name):\n    return logging.getLogger(name)\n",
    "vllm/multimodal/__init__.py": "",
    "vllm/multimodal/utils.py": "def get_mm_features_in_window(*args, **kwargs):\n    raise NotImplementedError\n",
    "vllm/utils/__init__.py": "",
    "vllm/v1/__init__.py": "",
    "vllm/v1/kv_cache_interface.py": "".join(
        f"class {name}:\n    pass\n\n\n" for name in
        ("KVCacheConfig", "KVCacheGroupSpec", "KVCacheSpec", "MambaSpec", "UniformTypeKVCacheSpecs")
    ) + "def iter_layer_specs(*args):\n    return iter(())\n",
    "vllm/v1/kv_cache_spec_registry.py": "class KVCacheSpecRegistry:\n    pass\n",
    "vllm/v1/request.py": "class Request:\n    pass\n",
    "vllm/v1/utils.py": "def tensor_data(t):\n    return t\n",
    "vllm/v1/core/__init__.py": "",
    "vllm/v1/core/kv_cache_metrics.py": "class KVCacheMetricsCollector:\n    pass\n",
    "vllm/distributed/__init__.py": "",
    "vllm/distributed/kv_events.py": _EVENTS,
    "cbor2/__init__.py": (
        "def dumps(*args, **kwargs):\n    raise NotImplementedError('cbor2 stub: only the CBOR hashes use it')\n"
    ),
}


def fetch(spec: str, dest: Path) -> Path:
    """Download the vLLM distribution ``spec`` (e.g. ``vllm==0.33.0``) into ``dest`` with pip."""
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                    "--quiet", "-d", str(dest), spec], check=True)
    found = sorted(dest.glob("vllm-*.whl")) + sorted(dest.glob("vllm-*.tar.gz"))
    if not found:
        raise RuntimeError(f"pip download {spec} left no vLLM distribution in {dest}")
    return found[0]


def _read(dist: Path, rel: str) -> bytes:
    if dist.is_dir():
        return (dist / rel).read_bytes()
    if dist.suffix == ".whl":
        with zipfile.ZipFile(dist) as z:
            return z.read(rel)
    with tarfile.open(dist) as t:  # an sdist: <name>-<version>/vllm/...
        for m in t.getmembers():
            if m.name.endswith("/" + rel) and m.name.count("/") == rel.count("/") + 1:
                f = t.extractfile(m)
                if f is not None:
                    return f.read()
    raise FileNotFoundError(f"{rel} is not in {dist}")


def _version(dist: Path) -> str:
    name = dist.name
    return name.split("-")[1] if name.startswith("vllm-") else "source tree"


def load(dist: Path, workdir: Path) -> tuple[ModuleType, ModuleType, ModuleType, str]:
    """(block_pool, kv_cache_utils, hashing) modules of ``dist``, importable from ``workdir``; and the version."""
    for rel in REAL:
        out = workdir / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(_read(dist, rel))
    for rel, src in STUBS.items():
        out = workdir / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(src)
    sys.path.insert(0, str(workdir))
    bp = importlib.import_module("vllm.v1.core.block_pool")
    ku = importlib.import_module("vllm.v1.core.kv_cache_utils")
    hashing = importlib.import_module("vllm.utils.hashing")
    ku.init_none_hash(hashing.sha256)  # vLLM's default prefix_caching_hash_algo is "sha256"
    return bp, ku, hashing, _version(dist)


class VllmPool:
    """vLLM's ``BlockPool`` behind the benchmark's adapter interface (prefix caching on, KV events off:
    vLLM's defaults; the block size is 16)."""

    name = "vllm"

    def __init__(self, modules: tuple[ModuleType, ModuleType, ModuleType, str], block_size: int = 16) -> None:
        self.bp, self.ku, self.hashing, self.version = modules
        self.block_size = block_size

    def make(self, num_blocks: int) -> Any:
        return self.bp.BlockPool(num_blocks, True, self.block_size)

    def available(self, pool: Any) -> int:
        return int(pool.get_num_free_blocks())

    def alloc(self, pool: Any, n: int) -> list[Any]:
        return pool.get_new_blocks(n)  # type: ignore[no-any-return]

    def free(self, pool: Any, blocks: list[Any]) -> None:
        pool.free_blocks(blocks)

    def cache(self, pool: Any, blocks: list[Any], hashes: list[bytes]) -> None:
        pool.cache_full_blocks(SimpleNamespace(block_hashes=hashes), blocks, 0, len(blocks), self.block_size, 0)

    def chain(self, tokens: list[int], n: int) -> list[bytes]:
        out: list[bytes] = []
        parent = None
        bs = self.block_size
        for i in range(n):
            parent = self.ku.hash_block_tokens(self.hashing.sha256, parent, tokens[i * bs:(i + 1) * bs])
            out.append(parent)
        return out

    def lookup(self, pool: Any, tokens: list[int]) -> list[Any]:
        """Hash the prompt's full blocks, find the longest cached chain, take a reference to it."""
        bs = self.block_size
        hits: list[Any] = []
        parent = None
        for i in range((len(tokens) - 1) // bs):
            parent = self.ku.hash_block_tokens(self.hashing.sha256, parent, tokens[i * bs:(i + 1) * bs])
            got = pool.get_cached_block(parent, [0])
            if got is None:
                break
            hits.append(got[0])
        pool.touch(hits)
        return hits
