"""llama.cpp's own llama-server, built from the llama.cpp that llama-cpp-python vendors
(``scripts/build_llama_server``), started on the same model file as Hearth: the anchor row of
every benchmark."""

from __future__ import annotations

import os
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from hearth_server import ROOT, free_port


def llama_server_binary() -> Path:
    """The cached binary, built on first use (a few minutes on 2 cores), or the one
    ``HEARTH_LLAMA_SERVER`` names (a GPU build from the same source: scripts/device/gpu-bench)."""
    given = os.environ.get("HEARTH_LLAMA_SERVER")
    if given:
        return Path(given)
    out = subprocess.run([str(ROOT / "scripts" / "build_llama_server")], check=True, text=True,
                         stdout=subprocess.PIPE).stdout.strip().splitlines()
    return Path(out[-1])


class LlamaServer:
    def __init__(self, model: Path, *args: str, port: int | None = None):
        self.model = model
        self.args = list(args)
        self.port = port or free_port()
        self.proc: subprocess.Popen | None = None
        self.log_path: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 180.0) -> LlamaServer:
        cmd = [str(llama_server_binary()), "-m", str(self.model), "--host", "127.0.0.1",
               "--port", str(self.port), "--no-webui", *self.args]
        log_dir = Path(os.environ.get("HEARTH_TEST_LOGS", "/tmp/hearth-test-logs"))
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"llama-server-{self.port}.log"
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self.proc.returncode}: "
                                   f"{self.log_path.read_text(errors='replace')[-3000:]}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"llama-server not ready after {timeout} s")

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        self.proc = None

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
