"""Every test run: llama.cpp's threads sleep while they wait for each other, as in the add-on
image. The tests share 2 cores with Home Assistant, servers and clients; spinning threads slow
a decode there several times over (docs/hardware.md: a machine shared with Home Assistant).
Set here, before any test module loads llama.cpp; servers the tests start inherit it."""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
