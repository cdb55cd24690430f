"""Print the pinned requirements of the Home Assistant components Hearth's tests load.

Home Assistant's test plugin installs Home Assistant but not the requirements of the components
an integration depends on (or that its tests set up), and those pins change with every release.
This reads them from the installed release itself: the closure of `dependencies` and
`after_dependencies` of Hearth's manifest, of TESTED_BESIDE and of any extra domains named on
the command line (such as the demo's), one requirement per line, for `pip install -r`.

Usage: python scripts/ha_requirements.py [DOMAIN ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

MANIFEST = Path(__file__).resolve().parents[1] / "custom_components" / "hearth" / "manifest.json"
# Home Assistant's own integrations the tests set up beside Hearth's (its Ollama integration
# against Hearth's Ollama API); their clients also serve the server tests, at the pinned version.
TESTED_BESIDE = ["ollama"]


def components_dir() -> Path:
    """The installed Home Assistant's components folder (found without importing it)."""
    import importlib.util

    spec = importlib.util.find_spec("homeassistant")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("homeassistant is not installed in this environment")
    return Path(next(iter(spec.submodule_search_locations))) / "components"


def closure_requirements(roots: list[str], components: Path) -> list[str]:
    """Requirements of every component reachable from ``roots``, first seen first."""
    seen: set[str] = set()
    pending = list(roots)
    requirements: list[str] = []
    while pending:
        domain = pending.pop(0)
        if domain in seen:
            continue
        seen.add(domain)
        path = components / domain / "manifest.json"
        if not path.exists():  # e.g. a domain that only a newer release has
            continue
        manifest = json.loads(path.read_text())
        for requirement in manifest.get("requirements", ()):
            if requirement not in requirements:
                requirements.append(requirement)
        pending += manifest.get("dependencies", []) + manifest.get("after_dependencies", [])
    return requirements


def main(argv: list[str]) -> int:
    ours = json.loads(MANIFEST.read_text())
    roots = [*ours.get("dependencies", []), *ours.get("after_dependencies", []),
             *TESTED_BESIDE, *argv]
    for requirement in closure_requirements(roots, components_dir()):
        print(requirement)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
