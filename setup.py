"""One build step beyond pyproject.toml: the kubelet device-plugin gRPC modules are generated from
src/kvguardian/ops/k8s/api/deviceplugin.proto by grpcio-tools (a build requirement in pyproject.toml) on every
build, so generated code is never committed. A wheel carries them; an editable install (scripts/setup.sh)
writes them beside the .proto, where .gitignore keeps them out of the repository."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from setuptools import Command, setup
from setuptools.command.build import build

SRC = Path(__file__).resolve().parent / "src"
PROTO = Path("kvguardian", "ops", "k8s", "api", "deviceplugin.proto")
GENERATED = ("deviceplugin_pb2.py", "deviceplugin_pb2_grpc.py", "deviceplugin_pb2.pyi")


class BuildDevicePluginAPI(Command):
    """Run protoc (grpcio-tools) on deviceplugin.proto into the build tree, or in place for an editable install."""

    description = "generate kvguardian/ops/k8s/api/deviceplugin_pb2*.py(i) from deviceplugin.proto"
    user_options: ClassVar[list[tuple[str, str | None, str]]] = []
    editable_mode = False

    def initialize_options(self) -> None:
        self.build_lib: str | None = None

    def finalize_options(self) -> None:
        self.set_undefined_options("build_py", ("build_lib", "build_lib"))

    def _out(self) -> Path:
        return SRC if self.editable_mode else Path(str(self.build_lib))

    def run(self) -> None:
        from grpc_tools import protoc  # a build requirement: [build-system] requires in pyproject.toml

        out = self._out()
        (out / PROTO.parent).mkdir(parents=True, exist_ok=True)
        # -I src: the modules import each other as kvguardian.ops.k8s.api.deviceplugin_pb2
        rc = protoc.main(["grpc_tools.protoc", f"-I{SRC}", f"--python_out={out}", f"--grpc_python_out={out}",
                          f"--pyi_out={out}", str(SRC / PROTO)])
        if rc != 0:
            raise RuntimeError(f"grpc_tools.protoc failed on {SRC / PROTO} (exit {rc})")

    def get_source_files(self) -> list[str]:
        return [str(Path("src") / PROTO)]

    def get_outputs(self) -> list[str]:
        return [str(self._out() / PROTO.parent / name) for name in GENERATED]

    def get_output_mapping(self) -> dict[str, str]:
        return {}


# first, so that build_py finds the package directory already holding the modules in a non-editable build
build.sub_commands = [("build_deviceplugin_api", None), *build.sub_commands]
setup(cmdclass={"build_deviceplugin_api": BuildDevicePluginAPI})
