"""Add the llama.cpp backend libraries that llama-cpp-python's wheel leaves out.

    python wheel_add_libs.py WHEEL BUILD_DIR OUT_DIR

llama-cpp-python installs a fixed list of libraries; a GGML_BACKEND_DL build with
GGML_CPU_ALL_VARIANTS also makes one ``libggml-cpu-<variant>.so`` per instruction-set level (and
``libggml-vulkan.so`` and the like), found only in its build folder. This copies each such
library from BUILD_DIR into the wheel's ``llama_cpp/lib`` and writes the wheel, its RECORD made
anew, into OUT_DIR, so an install from the wheel cache is whole.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def main(wheel: str, build_dir: str, out_dir: str) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "wheel", "unpack", wheel, "-d", tmp], check=True)
        (root,) = Path(tmp).iterdir()
        lib = root / "llama_cpp" / "lib"
        added = []
        for found in sorted(Path(build_dir).rglob("libggml-*.so")):
            if found.is_file() and not (lib / found.name).exists():
                shutil.copy2(found, lib / found.name)
                added.append(found.name)
        variants = sorted(p.name for p in lib.glob("libggml-cpu-*.so"))
        if not variants:
            print("no libggml-cpu-*.so in the build: was it built with GGML_BACKEND_DL?",
                  file=sys.stderr)
            return 1
        subprocess.run(["strip", "--strip-unneeded", *map(str, lib.glob("*.so"))], check=False)
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "wheel", "pack", str(root), "-d", out_dir],
                       check=True)
    print(f"added {len(added)} libraries: {', '.join(added)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
