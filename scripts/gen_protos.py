"""Generate the Python gRPC stubs in src/gateway/proto/ from proto/*.proto.

The generated files are committed so a fresh clone needs no code generation;
tests/test_stubs_fresh.py regenerates into a temporary folder and fails when the
committed stubs no longer match proto/. Run this after editing any .proto:

    python scripts/gen_protos.py            # write src/gateway/proto/
    python scripts/gen_protos.py --out DIR  # write elsewhere (used by the test)
"""

from __future__ import annotations

import argparse
import re
import sys
from importlib import resources
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
DEFAULT_OUT = ROOT / "src" / "gateway" / "proto"
PACKAGE = "gateway.proto"

# protoc emits `import common_pb2 as ...` for sibling files; inside a package
# that import must be absolute.
_SIBLING_IMPORT = re.compile(r"^import (\w+_pb2) as (\w+)$", re.MULTILINE)


def generate(out_dir: Path) -> list[Path]:
    from grpc_tools import protoc

    out_dir.mkdir(parents=True, exist_ok=True)
    protos = sorted(PROTO_DIR.glob("*.proto"))
    well_known = str(resources.files("grpc_tools") / "_proto")
    args = [
        "protoc",
        f"-I{PROTO_DIR}",
        f"-I{well_known}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *[str(p) for p in protos],
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    written: list[Path] = []
    for path in sorted(out_dir.glob("*_pb2*.py*")):
        text = path.read_text()
        fixed = _SIBLING_IMPORT.sub(rf"from {PACKAGE} import \1 as \2", text)
        if path.suffix == ".pyi":
            fixed = re.sub(r"^import (\w+_pb2) as (\w+)$", rf"from {PACKAGE} import \1 as \2", fixed, flags=re.MULTILINE)
        if fixed != text:
            path.write_text(fixed)
        written.append(path)
    init = out_dir / "__init__.py"
    init.write_text('"""Generated gRPC stubs (scripts/gen_protos.py). Never edit by hand."""\n')
    written.append(init)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path.relative_to(args.out.parent) if args.out == DEFAULT_OUT else path.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
