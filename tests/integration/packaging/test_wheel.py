"""The wheel installs anywhere: built from the repository (sdist, then the wheel from that sdist), checked by twine,
installed into fresh virtual environments outside the repository, and run there.

- the build: ``python -m build --no-isolation`` with this environment's locked setuptools, wheel and grpcio-tools
  (``[build-system] requires``); the wheel is built from the sdist, so the sdist is proven to carry what a build
  needs. The generated gRPC modules come from setup.py's protoc step, never from the sdist.
- venv 1: the wheel with only its core dependencies, plus pytest: ``kv-guardian --help``, ``--version`` and the
  pytest plugin (``pytest11`` entry point) on a small test file that needs no torch.
- venv 2: ``kv-guardian[redis]`` without torch: ``kv-guardian redis --help`` and ``kv-guardian redis rdb FILE
  --json`` on a small RDB file made here (CRC64 included, so the extra's ``anycrc`` is what verifies it).

Every dependency is pinned to requirements/venv.txt (as a pip constraints file, hashes dropped) and comes from the
package index (pip's cache makes a rerun fast).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import kvguardian

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the suite runs on 3.11
    import tomli as tomllib

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
PKG = ROOT / "src" / "kvguardian"
GENERATED = ("deviceplugin_pb2.py", "deviceplugin_pb2_grpc.py", "deviceplugin_pb2.pyi")
STEP_TIMEOUT = 300  # one build or pip install; a warm pip cache takes seconds

PLUGIN_TESTS = '''
import pytest

def test_the_plugin_comes_from_the_installed_wheel(request):
    import kvguardian.runtime.pytest_plugin as mod
    plugin = request.config.pluginmanager.get_plugin("kvguardian-manager")
    assert isinstance(plugin, mod.KVGuardianPlugin)
    assert "site-packages" in mod.__file__, mod.__file__

def test_the_kv_guard_fixture(kv_guard):
    from kvguardian.runtime.guard import Guard
    assert isinstance(kv_guard, Guard)

@pytest.mark.kv_no_leak
def test_a_marked_test_is_checked():
    pass

def test_torch_is_not_installed():
    with pytest.raises(ImportError):
        import torch  # noqa: F401
'''


def _env(venv: Path | None = None) -> dict[str, str]:
    """The environment without this test run's Python settings; a venv's bin first on PATH."""
    env = {k: v for k, v in os.environ.items()
           if k not in {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP"} and not k.startswith("KVG_")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    if venv is not None:
        env["VIRTUAL_ENV"] = str(venv)
        env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


def _run(*cmd: str | Path, cwd: Path, venv: Path | None = None, ok: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=_env(venv), capture_output=True, text=True,
                          timeout=STEP_TIMEOUT, check=False)
    if ok:
        assert proc.returncode == 0, f"{cmd} exited {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc


def _constraints(tmp: Path) -> Path:
    """requirements/venv.txt without its --hash parts: pip installs exactly the locked versions."""
    lines = []
    for line in (ROOT / "requirements" / "venv.txt").read_text().splitlines():
        spec = line.split("#", 1)[0].split("--hash", 1)[0].strip().rstrip("\\").strip()
        if spec:
            lines.append(spec)
    assert any(s.startswith("redis==") for s in lines) and any(s.startswith("pytest==") for s in lines)
    out = tmp / "constraints.txt"
    out.write_text("\n".join(lines) + "\n")
    return out


def _venv(path: Path, work: Path) -> Path:
    """A fresh virtual environment outside the repository, from the interpreter the lock is for (CPython 3.11)."""
    python = shutil.which("python3.11") or sys.executable
    _run(python, "-m", "venv", path, cwd=work, venv=None)
    assert not path.resolve().is_relative_to(ROOT)
    return path


def _crc64_redis(data: bytes) -> int:
    """Redis's CRC64 (Jones polynomial, reflected), as redis-server writes it after the EOF opcode."""
    crc = 0
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x95AC9329AC4BC9B5 if crc & 1 else 0)
    return crc


def _rdb_file(path: Path) -> Path:
    """An RDB 11 file as Redis 7.0 saves it: 40 ``session:N`` strings and 10 others in db 0, with its CRC64."""

    def string(s: str) -> bytes:
        b = s.encode()
        assert len(b) < 64  # a 6-bit length
        return bytes([len(b)]) + b

    records = [b"\x00" + string(f"session:{i}") + string("v" * 40) for i in range(40)]
    records += [b"\x00" + string(f"config-{name}") + string("x" * 20) for name in "abcdefghij"]
    body = (b"REDIS0011" + b"\xfa" + string("redis-ver") + string("7.0.15")
            + b"\xfe\x00" + b"\xfb" + bytes([len(records), 0]) + b"".join(records) + b"\xff")
    path.write_bytes(body + _crc64_redis(body).to_bytes(8, "little"))
    return path


def _check_wheel(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in GENERATED:
        assert f"kvguardian/ops/k8s/api/{name}" in names, f"{wheel.name} lacks the generated {name}"
    assert "kvguardian/py.typed" in names
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    for pattern in package_data["kvguardian"]:
        for f in PKG.glob(pattern):
            assert f"kvguardian/{f.relative_to(PKG).as_posix()}" in names, f"{wheel.name} lacks {f} ({pattern})"
    for f in PKG.rglob("*.py"):
        if "__pycache__" not in f.parts:
            assert f"kvguardian/{f.relative_to(PKG).as_posix()}" in names, f"{wheel.name} lacks {f}"
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "kv-guardian = kvguardian.apps.cli:main" in text and "kvguardian = kvguardian.runtime.pytest_plugin" in text


def _check_sdist(sdist: Path) -> None:
    with tarfile.open(sdist) as tf:
        top, *_ = tf.getnames()
        names = {n.removeprefix(f"{top.split('/')[0]}/") for n in tf.getnames()}
    for needed in ("setup.py", "pyproject.toml", "README.md", "LICENSE", "MANIFEST.in",
                   "src/kvguardian/ops/k8s/api/deviceplugin.proto", "src/kvguardian/py.typed"):
        assert needed in names, f"{sdist.name} lacks {needed}"
    # generated on every build (setup.py): a developer's editable-install copies never ship
    assert not [n for n in names if "deviceplugin_pb2" in n]


def test_the_wheel_installs_and_runs_outside_the_repository(tmp_path):
    dist = tmp_path / "dist"
    # sdist, then the wheel from the unpacked sdist; --no-isolation: the locked build tools of this environment
    _run(sys.executable, "-m", "build", "--no-isolation", "--outdir", dist, ROOT, cwd=tmp_path)
    wheel, = dist.glob("kv_guardian-*.whl")
    sdist, = dist.glob("kv_guardian-*.tar.gz")
    assert wheel.name == f"kv_guardian-{kvguardian.__version__}-py3-none-any.whl"
    _check_wheel(wheel)
    _check_sdist(sdist)
    twine = _run(sys.executable, "-m", "twine", "check", "--strict", wheel, sdist, cwd=tmp_path)
    assert twine.stdout.count("PASSED") == 2, twine.stdout

    constraints = _constraints(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    (work / "pytest.ini").write_text("[pytest]\n")  # the rootdir: nothing of the repository's configuration

    # venv 1: the core dependencies only, plus pytest for the plugin
    core = _venv(tmp_path / "venv-core", work)
    _run(core / "bin" / "python", "-m", "pip", "install", "-q", "-c", constraints, wheel, "pytest", cwd=work,
         venv=core)
    out = _run(core / "bin" / "kv-guardian", "--help", cwd=work, venv=core).stdout
    assert "usage: kv-guardian" in out and "redis" in out
    out = _run(core / "bin" / "kv-guardian", "--version", cwd=work, venv=core).stdout
    assert out.strip() == f"kv-guardian {kvguardian.__version__}"
    where = _run(core / "bin" / "python", "-c", "import kvguardian; print(kvguardian.__file__)", cwd=work,
                 venv=core).stdout.strip()
    assert Path(where).resolve().is_relative_to(core.resolve()), where
    (work / "test_uses_plugin.py").write_text(PLUGIN_TESTS)
    proc = _run(core / "bin" / "python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "--kv-report",
                "kv.jsonl", "test_uses_plugin.py", cwd=work, venv=core)
    assert re.search(r"\b4 passed\b", proc.stdout), proc.stdout
    rows = [json.loads(line) for line in (work / "kv.jsonl").read_text().splitlines()]
    assert [r["test"] for r in rows] == ["test_uses_plugin.py::test_a_marked_test_is_checked"]
    assert rows[0]["findings"] == []
    assert "--kv-no-leak-all" in _run(core / "bin" / "python", "-m", "pytest", "--help", cwd=work,
                                      venv=core).stdout

    # venv 2: kv-guardian[redis], no torch: the offline RDB analysis
    redis = _venv(tmp_path / "venv-redis", work)
    _run(redis / "bin" / "python", "-m", "pip", "install", "-q", "-c", constraints,
         f"kv-guardian[redis] @ {wheel.as_uri()}", cwd=work, venv=redis)
    out = _run(redis / "bin" / "kv-guardian", "redis", "--help", cwd=work, venv=redis).stdout
    assert "rdb" in out
    rdb = _rdb_file(work / "dump.rdb")
    proc = _run(redis / "bin" / "kv-guardian", "redis", "rdb", rdb, "--json", cwd=work, venv=redis)
    result = json.loads(proc.stdout)
    assert result["complete"] is True and result["mode"] == "rdb"
    assert result["dbsize"] == 50 and result["keys_scanned"] == 50
    assert result["server"]["rdb"]["checksum"] == "ok"  # anycrc (the redis extra) verified the CRC64
    sessions = next(p for p in result["patterns"] if p["pattern"] == "session:{int}")
    assert sessions["keys"] == 40
    no_torch = _run(redis / "bin" / "python", "-c", "import torch", cwd=work, venv=redis, ok=False)
    assert no_torch.returncode != 0 and "No module named 'torch'" in no_torch.stderr
    installed = _run(redis / "bin" / "python", "-m", "pip", "list", "--format=json", cwd=work, venv=redis).stdout
    names = {re.sub(r"[-_.]+", "-", p["name"]).lower() for p in json.loads(installed)}
    assert {"kv-guardian", "redis", "hiredis", "anycrc", "prometheus-client"} <= names
    assert not names & {"torch", "transformers", "pytest"}
