"""Build hook: generates jobq.v1 (the gRPC stubs and their typed .pyi) from
proto/jobq/v1/jobq.proto while the package is built, so `pip install
./clients/python` needs no separate step and the stubs never drift from the
proto.

The proto is looked up in $JOBQ_PROTO_DIR, then ../../proto (pip builds a
local directory in place, so the repository's proto/ is reachable), then
./proto (where an sdist carries it). An editable install (`pip install -e`) writes the stubs into the
source tree (jobq/v1/, git-ignored); reinstall after a proto change.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO = os.path.join("jobq", "v1", "jobq.proto")


def proto_root() -> str:
    candidates = [
        os.environ.get("JOBQ_PROTO_DIR", ""),
        os.path.join(HERE, "..", "..", "proto"),
        os.path.join(HERE, "proto"),
    ]
    for c in candidates:
        if c and os.path.isfile(os.path.join(c, PROTO)):
            return os.path.abspath(c)
    raise SystemExit(
        f"jobq-client: {PROTO} not found in {candidates}; build from a jobq "
        "checkout or set JOBQ_PROTO_DIR to the folder holding jobq/v1/jobq.proto"
    )


def plugin(name: str, func: str, scratch: str) -> str:
    """The protoc plugin `name` from mypy-protobuf: its console script when
    it is on PATH, else a small script running it with this Python."""
    found = shutil.which(name)
    if found:
        return found
    import sys

    path = os.path.join(scratch, name)
    with open(path, "w") as f:
        f.write(f"#!{sys.executable}\nimport sys\nsys.path[:0] = {sys.path!r}\n"
                f"from mypy_protobuf.main import {func}\n{func}()\n")
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
    return path


def generate(out: str) -> None:
    import grpc_tools
    from grpc_tools import protoc

    root = proto_root()
    wkt = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    target = os.path.join(out, "jobq", "v1")
    shutil.rmtree(target, ignore_errors=True)
    os.makedirs(target)
    with tempfile.TemporaryDirectory() as scratch:
        args = [
            "grpc_tools.protoc", f"-I{root}", f"-I{wkt}",
            f"--plugin=protoc-gen-mypy={plugin('protoc-gen-mypy', 'main', scratch)}",
            f"--plugin=protoc-gen-mypy_grpc={plugin('protoc-gen-mypy_grpc', 'grpc', scratch)}",
            f"--python_out={out}", f"--grpc_python_out={out}",
            f"--mypy_out={out}", f"--mypy_grpc_out={out}",
            os.path.join(root, PROTO),
        ]
        if protoc.main(args) != 0:
            raise SystemExit("jobq-client: protoc failed on " + os.path.join(root, PROTO))
    with open(os.path.join(target, "__init__.py"), "w") as f:
        f.write('"""Generated from proto/jobq/v1/jobq.proto at build time."""\n')


class BuildWithStubs(build_py):
    def run(self) -> None:
        super().run()
        editable = getattr(self, "editable_mode", False)
        generate(HERE if editable else self.build_lib)


class SdistWithProto(sdist):
    """An sdist carries the proto as ./proto, so a wheel builds from it alone."""

    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        super().make_release_tree(base_dir, files)
        target = os.path.join(base_dir, "proto", "jobq", "v1")
        os.makedirs(target, exist_ok=True)
        shutil.copy(os.path.join(proto_root(), PROTO), target)


setup(cmdclass={"build_py": BuildWithStubs, "sdist": SdistWithProto})
