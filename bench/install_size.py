"""Benchmark: what installing kv-guardian costs on disk, per set of extras.

    nice .venv/bin/python bench/install_size.py                        # builds the wheel, every set below
    nice .venv/bin/python bench/install_size.py --wheel dist/kv_guardian-0.1.0-py3-none-any.whl --sets core redis

For each set (core, [redis], [prometheus,serve,zmq], [lint], [k8s], [hf], [all]) a fresh virtual environment
(``python3.11 -m venv``, outside the repository) gets the wheel with those extras, every dependency pinned to
requirements/venv.txt (a pip constraints file, hashes dropped); where the set pulls in torch, the locked CPU torch
is installed first (``pip install torch==<locked>``: on this machine a local wheel). Measured: the disk use of the
venv's site-packages (allocated blocks, .pyc files pip compiles included) minus that of an empty venv's, the
number of distributions installed beyond the empty venv's, and the install's wall time (pip's cache warm or not:
a cold first run downloads). Without ``--wheel`` the wheel is built first (``python -m build --wheel
--no-isolation``, the locked build tools). Writes ``bench/results/install_size.json``.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from results_io import write_json  # noqa: E402

SETS: dict[str, list[str]] = {
    "core": [],
    "redis": ["redis"],
    "prometheus,serve,zmq": ["prometheus", "serve", "zmq"],
    "lint": ["lint"],
    "k8s": ["k8s"],
    "hf": ["hf"],
    "all": ["all"],
}
WITH_TORCH = {"hf", "all", "torch"}  # extras that pull in torch (the locked CPU build is installed first)
MB = 1_000_000


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"}}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def _run(*cmd: str | Path, cwd: Path) -> str:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=_env(), capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, cmd))} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n"
                         f"{proc.stderr[-3000:]}")
    return proc.stdout


def locked() -> dict[str, str]:
    """name -> version of requirements/venv.txt."""
    out = {}
    for line in (ROOT / "requirements" / "venv.txt").read_text().splitlines():
        spec = line.split("#", 1)[0].split("--hash", 1)[0].strip()
        if "==" in spec:
            name, version = spec.split("==", 1)
            out[name.strip().lower()] = version.strip()
    return out


def write_constraints(path: Path) -> Path:
    path.write_text("".join(f"{name}=={version}\n" for name, version in locked().items()))
    return path


def build_wheel(out: Path) -> Path:
    _run(sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", out, ROOT, cwd=out)
    wheel, = out.glob("kv_guardian-*.whl")
    return wheel


def site_packages(venv: Path) -> Path:
    found = list((venv / "lib").glob("python3*/site-packages"))
    assert len(found) == 1, found
    return found[0]


def disk_bytes(folder: Path) -> int:
    """Allocated bytes of every file and folder under ``folder`` (what ``du`` counts), hard links once."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            st = os.lstat(os.path.join(dirpath, name))
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
    return total


def distributions(venv: Path) -> set[str]:
    return {p.name.split("-", 1)[0].lower().replace("_", "-") for p in site_packages(venv).glob("*.dist-info")}


def make_venv(path: Path) -> Path:
    python = shutil.which("python3.11") or sys.executable
    _run(python, "-m", "venv", path, cwd=path.parent)
    return path


def measure(name: str, extras: list[str], wheel: Path, constraints: Path, work: Path,
            empty: tuple[int, set[str]]) -> dict[str, Any]:
    venv = make_venv(work / f"venv-{name.replace(',', '-')}")
    pip = (venv / "bin" / "python", "-m", "pip", "install", "-q", "-c", constraints)
    start = time.perf_counter()
    if set(extras) & WITH_TORCH:
        _run(*pip, f"torch=={locked()['torch'].split('+', 1)[0]}", cwd=work)
    requirement = f"kv-guardian[{','.join(extras)}] @ {wheel.as_uri()}" if extras else str(wheel)
    _run(*pip, requirement, cwd=work)
    seconds = time.perf_counter() - start
    size = disk_bytes(site_packages(venv)) - empty[0]
    added = sorted(distributions(venv) - empty[1])
    shutil.rmtree(venv)
    row = {"set": name, "extras": extras, "site_packages_mb": round(size / MB, 1), "packages": len(added),
           "install_s": round(seconds, 1), "distributions": added}
    print(f"{name:<22} {row['site_packages_mb']:>9.1f} MB {row['packages']:>4} packages "
          f"{row['install_s']:>7.1f} s", file=sys.stderr)
    return row


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--wheel", type=Path, help="the wheel to install (default: build one)")
    ap.add_argument("--sets", nargs="+", choices=list(SETS), default=list(SETS), help="extra sets to measure")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "install_size.json"))
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kvg-install-size-") as tmp:
        work = Path(tmp)
        wheel = args.wheel.resolve() if args.wheel else build_wheel(work)
        constraints = write_constraints(work / "constraints.txt")
        base = make_venv(work / "venv-empty")
        empty = (disk_bytes(site_packages(base)), distributions(base))
        pip_version = _run(base / "bin" / "python", "-m", "pip", "--version", cwd=work).split()[1]
        rows = [measure(name, SETS[name], wheel, constraints, work, empty) for name in args.sets]
    write_json(args.out, {
        "benchmark": "install_size",
        "wheel": wheel.name,
        "python": platform.python_version(),
        "pip": pip_version,
        "empty_venv_site_packages_mb": round(empty[0] / MB, 1),
        "empty_venv_distributions": sorted(empty[1]),
        "unit": "MB = 10^6 bytes allocated on disk (du), site-packages minus an empty venv's",
        "results": rows,
    })


if __name__ == "__main__":
    main()
