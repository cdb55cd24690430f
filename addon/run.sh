#!/bin/sh
# Start script of the Hearth add-on. The server reads the add-on options from
# /data/options.json itself; only what the add-on system fixes is given here:
#   /data          the add-on's private data (job store)
#   /config        the add-on config folder (app_config), /addon_configs/<id>_hearth on the host
#   /config/models model files: put GGUFs here, downloads land here (excluded from backups)
set -eu

mkdir -p /config/models

exec python3 -m hearth serve \
    --host 0.0.0.0 \
    --port 8080 \
    --options-file /data/options.json \
    --data-dir /data \
    --models-dir /config/models
