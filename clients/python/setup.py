"""Build hook: generates jobq.v1 (the gRPC stubs and their typed .pyi) from
the proto the package carries, jobq/proto/jobq/v1/jobq.proto, while the
package is built. The package is self-contained: it builds from a checkout,
a copied folder or its sdist alike, and the wheel ships the proto too.

jobq/proto/ is a copy of the repository's proto/ (CI diffs the two). A
build inside a checkout whose proto/ differs from the copy stops, rather
than ship stubs for an older contract. $JOBQ_PROTO_DIR builds from another
folder holding jobq/v1/jobq.proto instead.

The build writes nothing into the source folder: setuptools' build/ and
*.egg-info go to a temporary folder. An editable install (`pip install -e`)
writes the stubs into jobq/v1/ (git-ignored); reinstall after a proto change.
"""

from __future__ import annotations

import atexit
import filecmp
import os
import shutil
import stat
import sys
import tempfile

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO = os.path.join("jobq", "v1", "jobq.proto")
BUNDLED = os.path.join(HERE, "jobq", "proto")
CHECKOUT = os.path.join(HERE, "..", "..", "proto")


def proto_root() -> str:
    override = os.environ.get("JOBQ_PROTO_DIR", "")
    if override:
        if not os.path.isfile(os.path.join(override, PROTO)):
            raise SystemExit(f"jobq-client: $JOBQ_PROTO_DIR has no {PROTO}")
        return os.path.abspath(override)
    bundled = os.path.join(BUNDLED, PROTO)
    if not os.path.isfile(bundled):
        raise SystemExit(f"jobq-client: {bundled} is missing")
    upstream = os.path.join(CHECKOUT, PROTO)
    if os.path.isfile(upstream) and not filecmp.cmp(upstream, bundled, shallow=False):
        raise SystemExit(
            "jobq-client: proto/jobq/v1/jobq.proto changed; copy it into the package:\n"
            "  cp proto/jobq/v1/jobq.proto clients/python/jobq/proto/jobq/v1/jobq.proto")
    return BUNDLED


def plugin(name: str, func: str, scratch: str) -> str:
    """The protoc plugin `name` from mypy-protobuf: its console script when
    it is on PATH, else a small script running it with this Python."""
    found = shutil.which(name)
    if found:
        return found
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
        f.write('"""Generated from jobq/proto/jobq/v1/jobq.proto at build time."""\n')


class BuildWithStubs(build_py):
    def run(self) -> None:
        super().run()
        editable = getattr(self, "editable_mode", False)
        generate(HERE if editable else self.build_lib)


# Keep the source folder clean: pip builds a local folder in place.
_scratch = tempfile.mkdtemp(prefix="jobq-client-build-")
atexit.register(shutil.rmtree, _scratch, True)

setup(
    cmdclass={"build_py": BuildWithStubs},
    options={
        "build": {"build_base": os.path.join(_scratch, "build")},
        "egg_info": {"egg_base": _scratch},
    },
)
