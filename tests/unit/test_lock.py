"""The one lock (addon/requirements.lock): the add-on image installs it, the tests run on it.

Fails when a dependency of Hearth is missing from the lock, when the lock pins something this
environment (the one the server's tests run in) does not have at that version, or when the
image would install anything beside the lock.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "addon" / "requirements.lock"
sys.path.insert(0, str(ROOT / "scripts" / "addon"))

import lock  # noqa: E402  (scripts/addon/lock.py)


def pins() -> dict[str, str]:
    out = {}
    for line in LOCK.read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"([a-z0-9-]+)==([0-9][0-9A-Za-z.+-]*)", line)
        assert m, f"not an exact, normalised pin: {line!r}"
        out[m[1]] = m[2]
    return out


def test_lock_is_this_environment():
    """The tests' environment has exactly the lock's versions, and nothing Hearth needs is
    missing from it (regenerate with scripts/addon/lock.py after a dependency change)."""
    expected = dict(line.split("==") for line in lock.lock_lines())
    assert pins() == expected


def test_every_declared_dependency_is_pinned():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {lock.norm(re.split(r"[<>=!~ \[;]", d, maxsplit=1)[0]) for d in deps}
    assert names <= set(pins()), f"not in the lock: {sorted(names - set(pins()))}"
    declared = [d for d in deps if d.startswith("llama-cpp-python")]
    assert declared == [f"llama-cpp-python=={pins()['llama-cpp-python']}"]


def test_image_installs_only_the_lock():
    docker = (ROOT / "addon" / "Dockerfile").read_text()
    installs = [ln for ln in docker.replace("\\\n", " ").splitlines() if "pip install" in ln]
    assert len(installs) == 2, installs
    for line in installs:
        assert "--no-deps" in line, f"resolves beyond the lock: {line.strip()}"
    assert "-r /dev/stdin" in installs[0] and "/tmp/requirements.lock" in installs[0]
    assert '"llama-cpp-python==${version}"' in installs[1]
    assert "COPY requirements.lock /tmp/requirements.lock" in docker
