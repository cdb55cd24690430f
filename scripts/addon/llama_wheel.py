"""Pack llama-cpp-python as the wheel its own build would have made, from its source
distribution's Python files and llama.cpp libraries compiled elsewhere (the aarch64 cross build:
scripts/addon/cross_llama_arm64). pip then installs it like any wheel, metadata included
(Hearth reports llama-cpp-python's version from it).

    python3 scripts/addon/llama_wheel.py SDIST_DIR LIB_DIR WHEEL_PATH

The wheel is tagged py3-none-<platform> (the package loads its libraries through ctypes, so no
CPython ABI is involved); the platform comes from WHEEL_PATH's name.
"""

from __future__ import annotations

import base64
import hashlib
import sys
import zipfile
from pathlib import Path


def record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def main(sdist: Path, libs: Path, wheel: Path) -> None:
    name, version, tag = wheel.stem.split("-", 2)
    files: dict[str, bytes] = {}
    for path in sorted((sdist / "llama_cpp").rglob("*")):
        rel = path.relative_to(sdist)
        if path.is_file() and "__pycache__" not in rel.parts and rel.parts[1:2] != ("lib",):
            files[rel.as_posix()] = path.read_bytes()
    so = sorted(p for p in libs.iterdir() if p.suffix == ".so" or ".so." in p.name)
    if not any(p.name == "libllama.so" for p in so):
        sys.exit(f"no libllama.so in {libs}")
    for path in so:
        files[f"llama_cpp/lib/{path.name}"] = path.read_bytes()
    info = f"{name}-{version}.dist-info"
    files[f"{info}/METADATA"] = (sdist / "PKG-INFO").read_bytes()
    files[f"{info}/WHEEL"] = (f"Wheel-Version: 1.0\nGenerator: hearth llama_wheel.py\n"
                              f"Root-Is-Purelib: false\nTag: {tag}\n").encode()
    record = [record_line(n, d) for n, d in files.items()] + [f"{info}/RECORD,,"]
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    tmp = wheel.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for n, d in files.items():
            info_ = zipfile.ZipInfo(n, date_time=(2020, 1, 1, 0, 0, 0))
            info_.external_attr = 0o644 << 16
            z.writestr(info_, d, zipfile.ZIP_DEFLATED)
    tmp.replace(wheel)
    print(f"{wheel.name}: {len(so)} libraries ({', '.join(p.name for p in so)})")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))
