"""The add-on's manifest (addon/config.yaml) against the server's settings and the add-on rules.

Fails when the add-on's options/schema and ``Settings.addon_fields()`` drift apart (names,
defaults, types, choices, ranges), and checks the rest of the add-on package: manifest keys, the
start script, the Dockerfile, translations, images, repository.yaml.
"""

from __future__ import annotations

import math
import re
import shlex
import subprocess
import tomllib
import types
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from PIL import Image

import hearth
from hearth.cli import build_parser
from hearth.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
ADDON = ROOT / "addon"
VULKAN = ROOT / "addon-vulkan"

# The option types the Supervisor understands that Hearth uses, with their arguments.
# Numbers: inclusive bounds "min,max", either side may be empty.
SCHEMA_RE = re.compile(
    r"^(?P<type>bool|str|password|int|float|list)"
    r"(?:\((?P<args>[^()]*)\))?"
    r"(?P<optional>\?)?$"
)
INT_BOUND = re.compile(r"^-?\d+$")
FLOAT_BOUND = re.compile(r"^-?\d*\.?\d+$")


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    return load_yaml(ADDON / "config.yaml")


def parse_schema(spec: str) -> dict[str, Any]:
    m = SCHEMA_RE.match(spec)
    assert m, f"unsupported schema element {spec!r}"
    typ, args, optional = m["type"], m["args"], bool(m["optional"])
    out: dict[str, Any] = {"type": typ, "optional": optional, "min": None, "max": None,
                           "choices": None}
    if typ == "list":
        assert args, f"{spec!r}: list() needs choices"
        out["choices"] = args.split("|")
    elif typ in ("int", "float"):
        if args is not None:
            lo, sep, hi = args.partition(",")
            assert sep, f"{spec!r}: a range is written (min,max)"
            pattern = INT_BOUND if typ == "int" else FLOAT_BOUND
            for bound in (lo, hi):
                assert not bound or pattern.match(bound), f"{spec!r}: bad bound {bound!r}"
            conv = int if typ == "int" else float
            out["min"] = conv(lo) if lo else None
            out["max"] = conv(hi) if hi else None
    else:
        assert args is None, f"{spec!r}: Hearth uses no length limits on strings"
    return out


def field_bounds(field: Any) -> dict[str, float | None]:
    bounds: dict[str, float | None] = {"ge": None, "gt": None, "le": None, "lt": None}
    for meta in field.metadata:
        for name in bounds:
            value = getattr(meta, name, None)
            if value is not None:
                bounds[name] = value
    return bounds


def field_kind(field: Any) -> tuple[str, list[str] | None]:
    ann = field.annotation
    if typing.get_origin(ann) in (typing.Union, types.UnionType):  # int | None: optional
        ann = next(a for a in typing.get_args(ann) if a is not type(None))
    if typing.get_origin(ann) is typing.Literal:
        return "list", [str(a) for a in typing.get_args(ann)]
    kinds = {bool: "bool", int: "int", float: "float", str: "str"}
    assert ann in kinds, f"no add-on schema type for {ann!r}"
    return kinds[ann], None


# Settings that are lists of entries (the add-on's list of dictionaries): checked on their own.
NESTED = {n: f for n, f in Settings.addon_fields().items()
          if typing.get_origin(f.annotation) is list}
SCALAR = {n: f for n, f in Settings.addon_fields().items() if n not in NESTED}


# --- settings <-> options/schema -------------------------------------------------------------

def test_options_and_schema_cover_exactly_the_addon_settings(config):
    fields = set(Settings.addon_fields())
    assert fields, "Settings.addon_fields() is empty"
    options, schema = set(config["options"]), set(config["schema"])
    assert options == fields, (f"options missing {sorted(fields - options)}, "
                               f"extra {sorted(options - fields)}")
    assert schema == fields, (f"schema missing {sorted(fields - schema)}, "
                              f"extra {sorted(schema - fields)}")
    not_addon = set(Settings.model_fields) - fields
    assert not (not_addon & (options | schema)), "start-script settings must not be options"


@pytest.mark.parametrize("name", sorted(SCALAR))
def test_option_default_matches_setting(config, name):
    field = SCALAR[name]
    value = config["options"][name]
    kind, _ = field_kind(field)
    assert value == field.default, f"{name}: add-on default {value!r} != {field.default!r}"
    expected_type = {"bool": bool, "int": int, "float": (int, float), "str": str,
                     "list": str}[kind]
    assert isinstance(value, expected_type), f"{name}: {value!r} is not {kind}"
    if kind != "bool":
        assert not isinstance(value, bool), f"{name}: {value!r} is a bool"


@pytest.mark.parametrize("name", sorted(SCALAR))
def test_schema_type_matches_setting(config, name):
    field = SCALAR[name]
    spec = parse_schema(str(config["schema"][name]))
    kind, choices = field_kind(field)
    if name == "api_key":
        assert spec["type"] == "password", "api_key must be a password field"
    elif kind == "str":
        assert spec["type"] == "str", f"{name}: schema {spec['type']} for a str setting"
    else:
        assert spec["type"] == kind, f"{name}: schema {spec['type']} for a {kind} setting"
    if spec["optional"]:
        assert field.default == "", f"{name}: only settings defaulting to '' may be optional"
    if kind == "list":
        assert sorted(spec["choices"]) == sorted(choices), (
            f"{name}: schema choices {spec['choices']} != setting choices {choices}")


@pytest.mark.parametrize("name", sorted(
    n for n, f in SCALAR.items() if field_kind(f)[0] in ("int", "float")))
def test_schema_range_matches_setting(config, name):
    """ge/le become the same inclusive bound; gt/lt a bound strictly inside (the Supervisor's
    ranges are inclusive); no bound on the setting, none in the schema."""
    assert_same_range(SCALAR[name], parse_schema(str(config["schema"][name])), name)


def assert_same_range(field: Any, spec: dict[str, Any], name: str) -> None:
    b = field_bounds(field)
    for side, incl, excl in (("min", "ge", "gt"), ("max", "le", "lt")):
        got = spec[side]
        if b[incl] is not None:
            assert got is not None and math.isclose(got, b[incl]), (
                f"{name}: schema {side} {got} != setting {incl}={b[incl]}")
        elif b[excl] is not None:
            assert got is not None, f"{name}: setting has {excl}={b[excl]}, schema no {side}"
            inside = got > b[excl] if side == "min" else got < b[excl]
            assert inside, f"{name}: schema {side} {got} admits {excl}={b[excl]}"
        else:
            assert got is None, f"{name}: schema {side} {got} but the setting has no bound"


@pytest.mark.parametrize("name", sorted(NESTED))
def test_a_list_of_entries_mirrors_its_model(config, name):
    """``models``: an empty list by default; one dictionary in the schema whose keys are the
    entry's fields, optional where the field has a default, with the same types and ranges.
    The Supervisor requires a list-valued key in every item, so lists are comma-separated
    strings there (the setting splits them)."""
    assert config["options"][name] == []
    schema = config["schema"][name]
    assert isinstance(schema, list) and len(schema) == 1 and isinstance(schema[0], dict)
    entry_model = typing.get_args(NESTED[name].annotation)[0]
    fields = entry_model.model_fields
    assert set(schema[0]) == set(fields), f"{name}: schema keys {sorted(schema[0])}"
    for key, field in fields.items():
        spec = parse_schema(str(schema[0][key]))
        assert spec["optional"] == (not field.is_required()), f"{name}.{key}: optional?"
        if typing.get_origin(field.annotation) is list:
            assert spec["type"] == "str", f"{name}.{key}: a list is a comma-separated str"
            continue
        kind, choices = field_kind(field)
        expected = "password" if key in ("api_key", "key") else kind
        assert spec["type"] == expected, f"{name}.{key}: schema {spec['type']} for {kind}"
        if kind == "list":
            assert sorted(spec["choices"]) == sorted(choices), f"{name}.{key}: choices"
        if kind in ("int", "float"):
            assert_same_range(field, spec, f"{name}.{key}")
    entry = {"name": "voice-model", "classes": "voice, chat"}
    entry.update({"aliases": "small"} if name == "models" else {"key": "k" * 16})
    parsed = entry_model.model_validate(entry)
    assert parsed.classes == ["voice", "chat"]


def test_option_defaults_are_valid_settings(config):
    settings = Settings.model_validate(config["options"])
    for name in Settings.addon_fields():
        assert getattr(settings, name) == config["options"][name]


# --- manifest --------------------------------------------------------------------------------

def test_manifest_basics(config):
    assert config["slug"] == "hearth"
    assert config["name"]
    assert config["description"]
    assert str(config["version"]) == hearth.__version__
    assert sorted(config["arch"]) == ["aarch64", "amd64"]
    # The Supervisor's init (tini) stays PID 1 and forwards SIGTERM: the image has no s6.
    assert config.get("init", True) is True
    # Prebuilt per-architecture images, as .github/workflows/addon-images.yaml names them.
    assert config["image"] == "ghcr.io/hearth-ha/{arch}-hearth"


def test_port_is_unpublished_by_default(config):
    assert config["ports"] == {"8080/tcp": None}
    assert "8080/tcp" in config.get("ports_description", {})
    assert not config.get("host_network", False)


def test_startup_discovery_and_hardware(config):
    """As the Supervisor's validator (supervisor/apps/validate.py, 2026.08) wants them, with no
    key it reports as deprecated or ignores."""
    # the default, application: Core does not wait for the model to load (and the add-on
    # linter rejects a key set to its default)
    assert "startup" not in config
    assert config["discovery"] == ["hearth"]
    assert "app_config:rw" in config["map"]  # addon_config is legacy since 2026.07
    assert any(p == "models" or p.startswith("models/") for p in config["backup_exclude"])
    assert "video" not in config  # the CPU image uses no GPU; the Vulkan add-on asks for it
    assert 10 <= config["timeout"] <= 300
    # 'boot: auto' is the default; 'watchdog' is redundant beside the image's HEALTHCHECK.
    for key in ("devices", "watchdog", "boot", "advanced", "codenotary"):
        assert key not in config, key
    assert not {"addon_config", "addons", "all_addon_configs", "config"} & {
        m.split(":")[0] for m in config["map"]}


def test_addon_manifests_in_repository():
    """The Supervisor treats every config.yaml/.yml/.json in the repository as an add-on."""
    names = {"config.yaml", "config.yml", "config.json"}
    try:
        out = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=ROOT, capture_output=True, check=True, timeout=60).stdout.decode()
        files = [f for f in out.split("\0") if f]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout
        files = [str(p.relative_to(ROOT)) for p in ROOT.rglob("config.*")
                 if ".git" not in p.parts]
    found = sorted(f for f in files
                   if Path(f).name in names and not f.startswith((".venv", ".git/")))
    assert found == ["addon-vulkan/config.yaml", "addon/config.yaml"], found


def test_vulkan_addon_is_the_same_addon_on_another_image(config):
    """Store users cannot pass build arguments, so the GPU build is its own add-on: the same
    options, schema and rules, its own name, slug and image, and the GPU granted."""
    vulkan = load_yaml(VULKAN / "config.yaml")
    own = {"name", "slug", "description", "image", "video"}
    assert {k: v for k, v in vulkan.items() if k not in own} == {
        k: v for k, v in config.items() if k not in own}
    assert vulkan["slug"] == "hearth_vulkan" and "Vulkan" in vulkan["name"]
    assert vulkan["image"] == "ghcr.io/hearth-ha/{arch}-hearth-vulkan"
    assert vulkan["video"] is True  # what grants /dev/dri; a 'devices' folder entry is ignored
    assert not (VULKAN / "Dockerfile").exists()  # image only: built from addon/
    for shared in ("DOCS.md", "CHANGELOG.md", "icon.png", "logo.png", "translations"):
        assert (VULKAN / shared).resolve() == (ADDON / shared).resolve(), shared
    assert (VULKAN / "README.md").read_text().startswith("# Hearth (Vulkan)")


def test_publishing_workflow_builds_both_images():
    wf = load_yaml(ROOT / ".github" / "workflows" / "addon-images.yaml")
    steps = [s for job in wf["jobs"].values() for s in job.get("steps", [])]
    uses = {s["uses"].split("@")[0] for s in steps if "uses" in s}
    assert {"home-assistant/builder/actions/prepare-multi-arch-matrix",
            "home-assistant/builder/actions/build-image",
            "home-assistant/builder/actions/publish-multi-arch-manifest"} <= uses
    assert "home-assistant/builder" not in uses  # the deprecated single action
    build = wf["jobs"]["build"]
    assert build["strategy"]["matrix"]["backend"] == ["cpu", "vulkan"]
    step = next(s for s in build["steps"] if "build-image" in s.get("uses", ""))
    assert step["with"]["context"] == "addon"
    assert "LLAMA_BACKEND=${{ matrix.backend }}" in step["with"]["build-args"]
    assert wf["jobs"]["manifest"]["strategy"]["matrix"]["image"] == ["hearth", "hearth-vulkan"]


def test_repository_yaml():
    repo = load_yaml(ROOT / "repository.yaml")
    assert repo["name"] == "Hearth add-ons"
    assert repo["url"].startswith("https://")
    assert repo["maintainer"]


# --- translations and docs -------------------------------------------------------------------

def test_every_option_is_translated(config):
    tr = load_yaml(ADDON / "translations" / "en.yaml")
    conf = tr["configuration"]
    assert set(conf) == set(config["schema"]), (
        f"untranslated {sorted(set(config['schema']) - set(conf))}, "
        f"stale {sorted(set(conf) - set(config['schema']))}")
    for name, entry in conf.items():
        assert entry.get("name"), f"{name}: no name"
        assert entry.get("description"), f"{name}: no description"
    assert set(tr.get("network", {})) == set(config["ports"])


def test_docs_list_every_option(config):
    docs = (ADDON / "DOCS.md").read_text(encoding="utf-8")
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `(\w+)` \|.*$", docs, re.M)}
    missing = sorted(set(config["options"]) - set(rows))
    assert not missing, f"DOCS.md options table lacks {missing}"
    for name, default in config["options"].items():
        if default == "":
            shown = "*(empty"
        elif isinstance(default, bool):
            shown = f"`{str(default).lower()}`"
        else:
            shown = f"`{default}`"
        assert shown in rows[name], f"DOCS.md shows no default {shown!r} for {name}"


def test_changelog_has_current_version(config):
    changelog = (ADDON / "CHANGELOG.md").read_text(encoding="utf-8")
    assert re.search(rf"^## {re.escape(str(config['version']))}\b", changelog, re.M)


def test_images():
    with Image.open(ADDON / "icon.png") as icon:
        assert icon.format == "PNG"
        assert icon.size == (128, 128)
    with Image.open(ADDON / "logo.png") as logo:
        assert logo.format == "PNG"
        w, h = logo.size
        assert 200 <= w <= 300 and 80 <= h <= 120


# --- start script and image ------------------------------------------------------------------

def start_command() -> list[str]:
    text = (ADDON / "run.sh").read_text(encoding="utf-8").replace("\\\n", " ")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("exec ")]
    assert len(lines) == 1, "run.sh must exec the server once"
    return shlex.split(lines[0])[1:]


def test_start_script_runs_the_server_like_the_tests():
    cmd = start_command()
    assert cmd[:3] == ["python3", "-m", "hearth"]
    args = build_parser().parse_args(cmd[3:])
    assert args.command == "serve"
    assert args.host == "0.0.0.0"
    assert args.port == "8080"
    assert args.options_file == "/data/options.json"
    assert args.data_dir == "/data"
    assert args.models_dir == "/config/models"
    # add-on options come only from options.json: no flag may override them
    assert not [n for n in Settings.addon_fields() if getattr(args, n, None) is not None]
    assert (ADDON / "run.sh").stat().st_mode & 0o111, "run.sh must be executable"


def test_dockerfile():
    """What the Supervisor's build needs since build.yaml is deprecated (2026.04): the base and
    every parameter in the Dockerfile; runtime CPU dispatch; the server as the entrypoint."""
    docker = (ADDON / "Dockerfile").read_text(encoding="utf-8")
    assert not (ADDON / "build.yaml").exists() and not (ADDON / "build.json").exists()
    assert re.search(r"^ARG BUILD_FROM=ghcr\.io/home-assistant/base-debian:trixie$", docker, re.M)
    assert re.search(r'^ENTRYPOINT \["/run.sh"\]\s*$', docker, re.M)
    assert re.search(r"^COPY hearth /opt/hearth/hearth\s*$", docker, re.M)
    assert "PYTHONPATH=/opt/hearth" in docker
    assert "-DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON" in docker
    assert "-DGGML_NATIVE=OFF" in docker and "-DGGML_VULKAN=ON" in docker
    assert 'io.hass.type="app"' in docker and 'licenses="MIT"' in docker
    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["license"] == "MIT"
    assert "HEALTHCHECK" in docker and "/health" in docker
    # the runtime stage installs no compiler
    runtime = docker.split("# --- runtime stage", 1)[1]
    for tool in ("build-essential", "cmake", "gcc", "python3-dev", "glslc"):
        assert tool not in runtime, tool
