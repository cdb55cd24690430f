"""Which model a request goes to: the models the settings name, their aliases, and each class's
default. Knows names only; loading is the fleet's.

Without a ``models`` list the server serves one model (``model``), named after its file, for
every class, as it always has. With one, each entry is named by the household, claims classes
(``voice`` to a small fast model, ``background`` to a larger one), and a class no entry claims
goes to the first entry.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from ..settings import CLASS_NAMES, ModelSpec, Settings
from .models import DEFAULT_FILE, ModelNotFound, resolve

ALIAS_CLASSES = ("voice", "chat", "agent", "background")
# Names every Hearth server answers to: the named class's default model.
GENERIC = ("hearth", "default")


class UnknownModel(KeyError):
    pass


def file_stem(model: str) -> str:
    """The name a single-model server has always used: its file's stem."""
    if not model:
        return Path(DEFAULT_FILE).stem
    if model.startswith(("https://", "http://")):
        return Path(urlparse(model).path).stem or "model"
    return Path(model).stem


@dataclass(frozen=True)
class Entry:
    name: str  # as listed (a single model keeps its file's spelling)
    spec: ModelSpec
    implicit: bool = False  # the one model of a server without a models list


@dataclass
class Registry:
    entries: list[Entry]
    _by_name: dict[str, str] = field(default_factory=dict)
    _by_class: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for e in self.entries:
            for n in (e.name, *e.spec.aliases):
                self._by_name[n.lower()] = e.name
            for c in e.spec.classes:
                self._by_class[c] = e.name
        first = self.entries[0].name
        for c in CLASS_NAMES:
            self._by_class.setdefault(c, first)

    @classmethod
    def from_settings(cls, s: Settings) -> Registry:
        if s.models:
            return cls([Entry(m.name, m) for m in s.models])
        # One model for every class, loaded at start and kept: the server as it always was,
        # named after the file it loads (a link's target, as the loaded model is).
        try:
            name = resolve(s.model, s.models_dir, download=False).stem
        except ModelNotFound:
            name = file_stem(s.model)
        spec = ModelSpec.model_construct(
            name=name.lower(), file=s.model, classes=[], aliases=[], n_ctx=None,
            n_parallel=None, n_gpu_layers=None, keep_alive_s=-1.0, pinned=True)
        return cls([Entry(name, spec, implicit=True)])

    @property
    def names(self) -> list[str]:
        return [e.name for e in self.entries]

    def entry(self, name: str) -> Entry:
        return next(e for e in self.entries if e.name == name)

    def for_class(self, cls: str) -> str:
        return self._by_class[cls]

    def route(self, name: str | None) -> tuple[str | None, str | None]:
        """(the model named, or None for the class's default; the class an alias names, or
        None). Raises UnknownModel for a name no model answers to."""
        if not name:
            return None, None
        base, _, tag = name.strip().lower().partition(":")
        if tag not in ("", "latest", *ALIAS_CLASSES):
            raise UnknownModel(name)
        cls = tag if tag in ALIAS_CLASSES else None
        if base in GENERIC:
            return None, cls
        if base not in self._by_name:
            raise UnknownModel(name)
        return self._by_name[base], cls

    def listed_names(self, name: str) -> list[str]:
        """A model, then one alias per class."""
        return [name, *(f"{name}:{c}" for c in ALIAS_CLASSES)]

    def all_names(self) -> list[str]:
        return [n for e in self.entries for n in self.listed_names(e.name)]
