"""The first GPU run, as one command on a machine that reaches nothing (scripts/device/README.md):
everything it needs comes in the working tree and the pack (``scripts/device/pack``), everything
it finds goes under OUT, for bench/results/. Stages, each given what time is left of --budget
(a stage that would not fit is skipped and says so):

  env     the GPU, Python, gdb, Vulkan; the pack's wheels where Python lacks them
  build   llama.cpp with CUDA from the pack's source (the libraries the bindings load, and
          llama-server), so both servers run the same kernels
  models  a 2-layer random-weight GGUF with SmolLM2's tokenizer (its ``smollm`` pre-tokenizer),
          and its copy with ``tokenizer.ggml.pre`` set to ``llama3``
  probe   scripts/device/load_probe.py on them: which variant of the worker's load crashes
          (import order, process set-up, both, under gdb), with each process's libraries,
          signals and /proc/PID/maps side by side
  bench   (only if the worker loaded) a full-size random-weight GGUF of Qwen2.5-Coder-1.5B's
          shapes (Qwen2's tokenizer), Hearth against llama-server at 1, 8 and 32 streams
  vulkan  the same build with Vulkan and its benchmark at 8 streams, where Vulkan has a device

  python3 scripts/device/first_gpu_run.py --pack .gpu-pack --out OUT [--budget 540]
  python3 scripts/device/first_gpu_run.py --cpu-dry-run --out OUT   the plumbing on a CPU: no
          build (the installed llama-cpp-python; HEARTH_LLAMA_SERVER or none), tiny shapes
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEVICE = ROOT / "scripts" / "device"


class Run:
    def __init__(self, a: argparse.Namespace):
        self.a, self.out = a, Path(a.out).resolve()
        self.out.mkdir(parents=True, exist_ok=True)
        # Builds and models outside OUT: what OUT holds comes back
        self.work = Path(a.work).resolve()
        self.work.mkdir(parents=True, exist_ok=True)
        self.deadline = time.monotonic() + a.budget
        self.rows: list[tuple[str, str, float]] = []
        self.site = self.work / "site"  # the bindings with the built libraries, the wheels
        self.llama_server: Path | None = None
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1",
                    "HEARTH_TEST_LOGS": str(self.out / "server-logs")}
        self.base_path = ""  # PYTHONPATH without the built bindings

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def sh(self, cmd: list[str], log: str, timeout: float, env: dict | None = None,
           cwd: Path | None = None) -> int:
        """``cmd`` with its output into OUT/``log``; its exit status (-999: timed out)."""
        timeout = max(1.0, min(timeout, self.left()))
        with open(self.out / log, "a") as f:
            f.write(f"$ {' '.join(map(str, cmd))}\n")
            f.flush()
            try:
                return subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout,
                                      env=env or self.env, cwd=cwd).returncode
            except subprocess.TimeoutExpired:
                f.write(f"\n(timed out after {timeout:.0f} s)\n")
                return -999

    def stage(self, name: str, need_s: float, fn) -> bool:
        t0 = time.monotonic()
        if self.left() < need_s:
            self.rows.append((name, f"skipped: {self.left():.0f} s left, needs ~{need_s:.0f}",
                              0.0))
            self.summary()
            return False
        print(f"[first-gpu-run] {name} ({self.left():.0f} s left)", file=sys.stderr, flush=True)
        try:
            outcome = fn() or "ok"
        except Exception as e:  # a stage that fails says why; the run goes on where it can
            outcome = f"failed: {type(e).__name__}: {e}"
        self.rows.append((name, outcome, time.monotonic() - t0))
        self.summary()
        return outcome == "ok" or outcome.startswith("ok")

    def summary(self) -> None:
        lines = ["| stage | outcome | s |", "|---|---|---:|"]
        lines += [f"| {n} | {o} | {s:.0f} |" for n, o, s in self.rows]
        (self.out / "summary.md").write_text("\n".join(lines) + "\n")

    # -- env ----------------------------------------------------------------------------------
    def stage_env(self) -> str:
        info = {"python": sys.version, "machine": platform.machine(),
                "dry_run": self.a.cpu_dry_run, "gdb": shutil.which("gdb") or "",
                "cuda_gdb": shutil.which("cuda-gdb") or "", "nvcc": shutil.which("nvcc") or "",
                "vulkaninfo": shutil.which("vulkaninfo") or "",
                "glslc": shutil.which("glslc") or ""}
        for cmd, key in ((["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                           "--format=csv,noheader"], "gpu"), (["vulkaninfo", "--summary"],
                                                               "vulkan")):
            try:
                info[key] = subprocess.run(cmd, capture_output=True, text=True,
                                           timeout=30).stdout.strip()[:2000]
            except (OSError, subprocess.TimeoutExpired) as e:
                info[key] = f"({e})"
        (self.out / "env.json").write_text(json.dumps(info, indent=1))
        wheels = sorted((Path(self.a.pack) / "whl").glob("*.whl")) if self.a.pack else []
        missing = self.missing_modules()
        if missing and wheels:
            self.sh([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                     "--no-compile", "--target", str(self.site), *map(str, wheels)],
                    "env.log", 120)
        self.base_path = os.pathsep.join(
            [str(self.site), str(ROOT / "addon"), self.env.get("PYTHONPATH", "")]).rstrip(":")
        self.env["PYTHONPATH"] = self.base_path
        still = self.missing_modules()
        return f"missing: {', '.join(still)}" if still else f"ok ({info.get('gpu') or 'no GPU'})"

    def missing_modules(self) -> list[str]:
        code = ("import importlib.util as u; print(' '.join(m for m in ('aiohttp', 'pydantic', "
                "'numpy', 'yaml', 'jinja2', 'diskcache') if u.find_spec(m) is None))")
        env = {**self.env, "PYTHONPATH": f"{self.site}:{self.env.get('PYTHONPATH', '')}"}
        got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=env)
        return got.stdout.split()

    # -- build --------------------------------------------------------------------------------
    def source(self) -> Path:
        """The llama-cpp-python source folder (its vendor/llama.cpp): unpacked from the pack,
        or (dry run) the cached one scripts/llama_source keeps."""
        if self.a.pack:
            dest = self.work / "src"
            if not dest.is_dir():
                with tarfile.open(Path(self.a.pack) / "src.tar.xz") as t:
                    t.extractall(dest, filter="tar")
            return next(dest.iterdir())
        got = subprocess.run([str(ROOT / "scripts" / "llama_source")], capture_output=True,
                             text=True, check=True)
        return Path(got.stdout.strip().splitlines()[-1])

    def build(self, flavour: str, targets: str) -> tuple[Path, Path]:
        """One CMake build of the vendored llama.cpp (``flavour``: cuda, vulkan or cpu):
        its shared libraries and llama-server's binary."""
        src = self.source()
        b = self.work / f"build-{flavour}"
        flags = {"cuda": ["-DGGML_CUDA=ON", f"-DGGML_CUDA_FA={self.a.cuda_fa}",
                          f"-DCMAKE_CUDA_ARCHITECTURES={self.a.cuda_arch}"],
                 "vulkan": ["-DGGML_VULKAN=ON"], "cpu": []}[flavour]
        if flavour == "cuda" and not shutil.which("nvcc"):
            os.environ["PATH"] = self.env["PATH"] = "/usr/local/cuda/bin:" + self.env["PATH"]
        log = f"build-{flavour}.log"
        rc = self.sh(["cmake", "-S", str(src / "vendor" / "llama.cpp"), "-B", str(b), "-G",
                      "Ninja" if shutil.which("ninja") else "Unix Makefiles",
                      "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DBUILD_SHARED_LIBS=ON",
                      "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                      "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=ON",
                      "-DLLAMA_BUILD_TOOLS=ON", *flags], log, 120)
        if rc == 0:
            rc = self.sh(["cmake", "--build", str(b), "--target", *targets.split(), "-j",
                          str(os.cpu_count() or 2)], log, self.left() - 60)
        if rc != 0:
            raise RuntimeError(f"the {flavour} build failed ({rc}; {log})")
        site = self.work / f"site-{flavour}"
        shutil.rmtree(site, ignore_errors=True)
        shutil.copytree(src / "llama_cpp", site / "llama_cpp")
        lib = site / "llama_cpp" / "lib"
        lib.mkdir(exist_ok=True)
        for so in b.rglob("*.so*"):
            shutil.copy2(so, lib / so.name, follow_symlinks=False)
        return site, next(b.rglob("bin/llama-server"))

    def stage_build(self) -> str:
        if self.a.cpu_dry_run and not self.a.build:
            self.llama_server = Path(os.environ["HEARTH_LLAMA_SERVER"]) \
                if os.environ.get("HEARTH_LLAMA_SERVER") else None
            return "ok (dry run: the installed llama-cpp-python; llama-server " \
                   f"{self.llama_server or 'not given'})"
        self.use(*self.build("cpu" if self.a.cpu_dry_run else "cuda", "llama llama-server"))
        return "ok"

    def use(self, site: Path, llama_server: Path) -> None:
        """Run both servers on this build: its bindings first on the path, its libraries."""
        self.llama_server = llama_server
        self.env["PYTHONPATH"] = f"{site}:{self.base_path}"
        self.env["LD_LIBRARY_PATH"] = str(site / "llama_cpp" / "lib")

    # -- models -------------------------------------------------------------------------------
    def make_model(self, *args: str, log: str = "models.log") -> None:
        src = self.source()
        env = {**self.env, "PYTHONPATH": os.pathsep.join(
            [str(src / "vendor" / "llama.cpp" / "gguf-py"), self.env["PYTHONPATH"]])}
        if self.sh([sys.executable, str(DEVICE / "make_model.py"), *args], log, 300, env) != 0:
            raise RuntimeError(f"make_model.py {args[0]} failed ({log})")

    def vocab(self, name: str) -> Path:
        """A vocabulary GGUF: the pack's, else (dry run) made here."""
        if self.a.pack and (Path(self.a.pack) / name).is_file():
            return Path(self.a.pack) / name
        if name == "vocab-qwen2.gguf":
            return self.source() / "vendor" / "llama.cpp" / "models" / "ggml-vocab-qwen2.gguf"
        dst = self.work / name
        if not dst.is_file():
            smollm = subprocess.run(
                [sys.executable, "-c", "from hearth.fleet.models import packaged_model as p; "
                 "print(p())"], capture_output=True, text=True, env=self.env, check=True)
            self.make_model("vocab", smollm.stdout.strip(), str(dst))
        return dst

    def stage_models(self) -> str:
        vocab = self.vocab("vocab-smollm2.gguf")
        self.make_model("model", str(vocab), str(self.work / "probe.gguf"), "--shape",
                        "smollm2-135m", "--layers", "2")
        self.make_model("copy", str(self.work / "probe.gguf"),
                        str(self.work / "probe-pre-llama3.gguf"), "--set",
                        "tokenizer.ggml.pre=llama3")
        return "ok"

    # -- probe --------------------------------------------------------------------------------
    def stage_probe(self) -> str:
        probe = self.out / "probe"
        self.sh([sys.executable, str(DEVICE / "load_probe.py"), str(self.work / "probe.gguf"),
                 "--pre-llama3", str(self.work / "probe-pre-llama3.gguf"), "--out", str(probe),
                 "--gpu-layers", str(0 if self.a.cpu_dry_run else -1),
                 "--timeout", str(self.a.variant_timeout)], "probe.log",
                self.left() - self.a.bench_need)
        summary = (probe / "summary.md").read_text() if (probe / "summary.md").is_file() else ""
        worker = next((ln.split("|")[2].strip() for ln in summary.splitlines()
                       if ln.startswith("| worker |")), "no result")
        return "ok" if worker == "ok" else f"the worker: {worker}"

    # -- bench --------------------------------------------------------------------------------
    def bench(self, name: str, streams: str) -> str:
        dry = self.a.cpu_dry_run
        model = self.work / ("bench-tiny.gguf" if dry else "bench-qwen2.5-1.5b.gguf")
        if not model.is_file():
            shape = ["--shape", "smollm2-135m", "--layers", "2"] if dry else \
                ["--shape", "qwen2.5-coder-1.5b"]
            self.make_model("model", str(self.vocab("vocab-qwen2.gguf")), str(model), *shape,
                            log="bench-model.log")
        env = dict(self.env)
        if self.llama_server:
            env["HEARTH_LLAMA_SERVER"] = str(self.llama_server)
        rc = self.sh([sys.executable, str(ROOT / "bench" / "streams.py"), "--model", str(model),
                      "--gpu-layers", str(0 if dry else -1), "--streams", streams,
                      "--tokens", str(self.a.tokens), "--out", str(self.out / name),
                      "--title", f"{name}: Hearth against llama-server",
                      *([] if self.llama_server else ["--no-llama-server"])],
                     f"{name}.log", self.left() - 5, env)
        if rc != 0:
            raise RuntimeError(f"bench/streams.py exited {rc} ({name}.log)")
        return "ok"

    def stage_vulkan(self) -> str:
        info = json.loads((self.out / "env.json").read_text())
        if not info["vulkaninfo"] or "deviceName" not in info.get("vulkan", ""):
            return "skipped: no Vulkan device (vulkaninfo)"
        if not info["glslc"]:
            return "skipped: no glslc to build llama.cpp's Vulkan shaders"
        self.use(*self.build("vulkan", "llama llama-server"))
        return self.bench("bench-vulkan", "8")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--pack", default="", help="the folder scripts/device/pack wrote")
    ap.add_argument("--work", default="/tmp/hearth-first-gpu-run", help="builds and models")
    ap.add_argument("--budget", type=float, default=540.0, help="seconds for everything")
    ap.add_argument("--cpu-dry-run", action="store_true")
    ap.add_argument("--build", action="store_true", help="dry run: build llama.cpp for the CPU")
    ap.add_argument("--cuda-arch", default="90")
    # Off by default: flash attention's kernels are most of a CUDA build's time, and this run
    # has ~9 minutes; both servers run the same build either way.
    ap.add_argument("--cuda-fa", default="OFF")
    ap.add_argument("--streams", default="")
    ap.add_argument("--tokens", type=int, default=0)
    ap.add_argument("--variant-timeout", type=float, default=0)
    ap.add_argument("--bench-need", type=float, default=0, help="seconds kept for the bench")
    a = ap.parse_args(argv)
    dry = a.cpu_dry_run
    a.streams = a.streams or ("1,2" if dry else "1,8,32")
    a.tokens = a.tokens or (16 if dry else 128)
    a.variant_timeout = a.variant_timeout or (60 if dry else 45)
    a.bench_need = a.bench_need or (30 if dry else 150)
    if not dry and not a.pack:
        ap.error("--pack is needed on the GPU machine (or --cpu-dry-run)")
    r = Run(a)
    r.stage("env", 5, r.stage_env)
    if not r.stage("build", 30 if dry else 240, r.stage_build):
        return 1
    # The benchmark only where the worker loaded (the probe says), Vulkan only on a GPU
    if r.stage("models", 10, r.stage_models) and r.stage("probe", 40, r.stage_probe) and \
            r.stage("bench", a.bench_need, lambda: r.bench("bench", a.streams)) and not dry:
        r.stage("vulkan", 200, r.stage_vulkan)
    print((r.out / "summary.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
