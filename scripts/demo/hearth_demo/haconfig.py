"""The demo Home Assistant's configuration directory.

Only what the demo needs is loaded (no ``default_config``: several of its integrations would want
packages the venv does not have, and some reach the internet). Every integration named here, and
their dependencies, have their requirements in the venv, so Home Assistant runs with --skip-pip.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD_SOURCE = ROOT / "docs" / "dashboard.yaml"
DASHBOARD_URL = "hearth-dashboard"  # a YAML dashboard's url_path must contain a hyphen
DASHBOARD_FILE = "hearth-dashboard.yaml"
DASHBOARD_VIEW = "hearth"  # the view's path in docs/dashboard.yaml

# Demo entities exposed to Assist, so the conversation agent has a household to talk about.
# The lights are template lights (on/off and brightness, kept in helpers that are not exposed):
# real `light` entities to Home Assistant's intents ("turn on the kitchen light") and tools.
DEMO_LIGHTS = {
    "kitchen_light": ("Kitchen light", "mdi:ceiling-light"),
    "living_room_lamp": ("Living room lamp", "mdi:floor-lamp"),
    "porch_light": ("Porch light", "mdi:outdoor-lamp"),
}
# The area of each light and of the sensor ("turn off the lights in the kitchen").
DEMO_AREAS = {"light.kitchen_light": "Kitchen", "light.living_room_lamp": "Living room",
              "light.porch_light": "Porch", "sensor.living_room_temperature": "Living room"}
DEMO_SENSOR = "sensor.living_room_temperature"
EXPOSED_ENTITIES = [*(f"light.{key}" for key in DEMO_LIGHTS), DEMO_SENSOR]
# Their helpers, kept from Assist (Home Assistant exposes some new entities by default).
HIDDEN_ENTITIES = [f"{domain}.{key}_{part}" for key in DEMO_LIGHTS
                   for domain, part in (("input_boolean", "power"), ("input_number", "level"))]

# The components configuration.yaml loads beyond Hearth's own closure, and those Home Assistant
# sets up on every start (2026.11 added infrared and radio_frequency); scripts/bootstrap installs
# their requirements (a domain a release does not have is skipped).
DEMO_COMPONENTS = (
    "frontend", "config", "history", "logbook", "recorder", "lovelace", "input_boolean",
    "input_number", "template", "light", "infrared", "radio_frequency",
)

CONFIGURATION = """\
# Written by scripts/demo (make run) on every start; edits here are overwritten.
homeassistant:
  name: Hearth demo home
  unit_system: metric
  time_zone: UTC
  country: GB
  language: en
  currency: EUR
  latitude: 51.5
  longitude: 0.0
  elevation: 10
  auth_providers:
    - type: homeassistant

http:
  server_host: 127.0.0.1
  server_port: {ha_port}

logger:
  default: warning
  logs:
    custom_components.hearth: info

frontend:
config:
conversation:
assist_pipeline:
history:
logbook:
recorder:
  purge_keep_days: 2
  commit_interval: 2

lovelace:
  dashboards:
    {dashboard_url}:
      mode: yaml
      title: Hearth
      icon: mdi:fire
      show_in_sidebar: true
      filename: {dashboard_file}

input_boolean:
{powers}
input_number:
{levels}
template:
  - light:
{lights}
  - sensor:
      - name: Living room temperature
        unique_id: hearth_demo_living_room_temperature
        unit_of_measurement: "°C"
        device_class: temperature
        state_class: measurement
        state: "{{{{ 21.5 }}}}"
"""


# One template light: state and brightness from its helpers, turned on and off through them.
LIGHT = """\
      - name: {name}
        unique_id: hearth_demo_{key}
        icon: {icon}
        state: "{{{{ is_state('input_boolean.{key}_power', 'on') }}}}"
        level: "{{{{ states('input_number.{key}_level') | int(255) }}}}"
        turn_on:
          - action: input_boolean.turn_on
            target:
              entity_id: input_boolean.{key}_power
        turn_off:
          - action: input_boolean.turn_off
            target:
              entity_id: input_boolean.{key}_power
        set_level:
          - action: input_number.set_value
            target:
              entity_id: input_number.{key}_level
            data:
              value: "{{{{ brightness }}}}"
          - action: input_boolean.turn_on
            target:
              entity_id: input_boolean.{key}_power
"""


def write_dashboard(path: Path) -> None:
    """docs/dashboard.yaml with a first section of the demo's lights, so the dashboard (and the
    e2e test's screenshot) shows what a command did."""
    dashboard = yaml.safe_load(DASHBOARD_SOURCE.read_text())
    home = {"type": "grid", "cards": [
        {"type": "heading", "heading": "Demo home", "icon": "mdi:home"},
        *({"type": "tile", "entity": f"light.{key}", "name": name}
          for key, (name, _) in DEMO_LIGHTS.items())]}
    dashboard["views"][0]["sections"].insert(0, home)
    path.write_text("# Written by scripts/demo from docs/dashboard.yaml and the demo's lights.\n"
                    + yaml.safe_dump(dashboard, sort_keys=False, allow_unicode=True))


def write_config(config_dir: Path, ha_port: int) -> None:
    """Write configuration.yaml and the dashboard (every start), and on a fresh directory mark
    the onboarding step that would start internet-bound integrations as done."""
    config_dir.mkdir(parents=True, exist_ok=True)
    powers = "".join(f"  {key}_power:\n    name: {name} power\n"
                     for key, (name, _) in DEMO_LIGHTS.items())
    levels = "".join(f"  {key}_level:\n    name: {name} level\n    min: 0\n    max: 255\n"
                     f"    initial: 255\n" for key, (name, _) in DEMO_LIGHTS.items())
    lights = "".join(LIGHT.format(key=key, name=name, icon=icon)
                     for key, (name, icon) in DEMO_LIGHTS.items())
    (config_dir / "configuration.yaml").write_text(CONFIGURATION.format(
        ha_port=ha_port, dashboard_url=DASHBOARD_URL, dashboard_file=DASHBOARD_FILE,
        powers=powers, levels=levels, lights=lights,
    ))
    write_dashboard(config_dir / DASHBOARD_FILE)
    # Home Assistant loads a custom integration from <config>/custom_components: link ours.
    custom = config_dir / "custom_components"
    custom.mkdir(exist_ok=True)
    link = custom / "hearth"
    target = ROOT / "custom_components" / "hearth"
    if link.is_symlink() and link.resolve() != target.resolve():
        link.unlink()
    if not link.exists():
        link.symlink_to(target, target_is_directory=True)

    storage = config_dir / ".storage"
    onboarding = storage / "onboarding"
    if not onboarding.exists():
        storage.mkdir(exist_ok=True)
        # Finishing the "core_config" step through the API starts config flows for met,
        # radio_browser, google_translate and shopping_list (weather and radio from the
        # internet). The demo's location is in configuration.yaml, so that step has nothing
        # to ask: mark it done; the other steps go through the onboarding API.
        onboarding.write_text(json.dumps({
            "version": 4, "minor_version": 1, "key": "onboarding",
            "data": {"done": ["core_config"]},
        }))
