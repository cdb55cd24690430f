"""A plain process that loads a model through the worker's bootstrap (hearth.runner.boot), as
the worker does but without its server, channels or serving: the bootstrap is imported first,
exactly as the worker's entry does (load_probe.py's plain variants).

    python3 scripts/device/plain_load.py CFG_JSON [--no-setup] [--server-first]
"""

import json
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "addon"))
if "--server-first" in sys.argv:  # the order the worker had before its bootstrap
    from load_probe import server_stack

    server_stack()

from hearth.runner import boot


def main() -> int:
    if "--no-setup" not in sys.argv:
        boot.set_up_process()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    loaded = boot.load(json.loads(sys.argv[1]), tell=lambda m: print(m, file=sys.stderr))
    print("rung:", loaded.rung, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
