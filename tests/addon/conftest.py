"""The ``addons`` fixture: add-on containers (tests/addon_container.py), removed after the test."""

from __future__ import annotations

from typing import Any

import pytest
from addon_container import Addon


@pytest.fixture
def addons(tmp_path):
    made: list[Addon] = []

    def make(*args: Any, **kwargs: Any) -> Addon:
        addon = Addon(*args, tmp_path / f"addon{len(made)}", **kwargs)
        made.append(addon)
        return addon

    yield make
    for addon in made:
        addon.remove()
