"""Fixtures for tests that talk to the real server over HTTP."""

from __future__ import annotations

import pytest
from hearth_server import HearthServer


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """One shared server (no API key) with the embedded SmolLM2 model."""
    data = tmp_path_factory.mktemp("hearth-data")
    with HearthServer("--max-queue", "64", data_dir=data) as s:
        yield s
