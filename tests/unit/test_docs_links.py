"""The documentation holds together: every relative link in README.md, docs/*.md and
addon/DOCS.md (and every link to this repository's own files on GitHub, which the add-on's page
uses since Home Assistant shows it outside the repository) resolves to a file, and to a heading
where it names one (GitHub's slugs); every docs/ page is reachable from the README; and the
benchmark runs the pages cite are the ones bench/results/ keeps, each saying how it was run."""

from __future__ import annotations

import re
from collections import deque
from pathlib import Path

import pytest

from hearth.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "addon" / "DOCS.md"]
RESULTS = ROOT / "bench" / "results"
# The add-on's documentation is shown inside Home Assistant, where a relative link goes nowhere.
REPO_URL = "https://github.com/hearth-ha/hearth/blob/main/"

FENCE = re.compile(r"^(```|~~~)")
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\".*\")?\s*$")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
# A dated run folder named anywhere in the text (with or without bench/results/ before it).
RUN = re.compile(r"(?<![\w/-])((?:[a-z][a-z-]*-)?\d{8}-[\w.-]+)")


def _prose(text: str) -> list[str]:
    """The page's lines outside fenced code blocks (a YAML comment there is no heading)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        lines.append("" if fenced else line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text without markup, lower case, punctuation dropped
    (letters, digits, '_' and '-' stay), spaces as hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = text.replace("`", "").replace("*", "").lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in _prose(page.read_text(encoding="utf-8")):
        if m := HEADING.match(line):
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(page: Path) -> list[str]:
    """The link targets of a page: inline links and images, and reference definitions."""
    out = []
    for line in _prose(page.read_text(encoding="utf-8")):
        if m := REFERENCE.match(line):
            out.append(m.group(1))
            continue
        out += [m.group(1) for m in INLINE_LINK.finditer(CODE_SPAN.sub("", line))]
    return out


def _local(page: Path, target: str) -> tuple[Path, str] | None:
    """Where a link points in this checkout (file, anchor), or None for the outside world."""
    if target.startswith(REPO_URL):
        path, _, anchor = target.removeprefix(REPO_URL).partition("#")
        return ROOT / path, anchor
    if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto: ...
        return None
    path, _, anchor = target.partition("#")
    return (page if not path else (page.parent / path).resolve()), anchor


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_the_pages_exist():
    assert (ROOT / "README.md").exists() and (ROOT / "addon" / "DOCS.md").exists()
    assert len(PAGES) > 5, "docs/ holds no pages"


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_link_resolves(page: Path):
    broken = []
    for target in links(page):
        where = _local(page, target)
        if where is None:
            continue
        path, anchor = where
        if not path.exists():
            broken.append(f"{target}: no file {path}")
        elif anchor and (path.suffix != ".md" or anchor not in anchors(path)):
            broken.append(f"{target}: no heading #{anchor} in {_rel(path)}")
    assert not broken, f"{_rel(page)}: " + "; ".join(broken)


def test_slugs_are_githubs():
    assert slug("The demo: `make run`") == "the-demo-make-run"
    assert slug("Hearth's own API") == "hearths-own-api"
    assert slug("The queue-health document (`GET /v1/queue`)") == \
        "the-queue-health-document-get-v1queue"
    assert slug("What the engine promises, and what it does not") == \
        "what-the-engine-promises-and-what-it-does-not"
    assert slug("`draft_model` and [drafts](engine.md)") == "draft_model-and-drafts"


def test_every_docs_page_is_reachable_from_the_readme():
    docs = {p.resolve() for p in (ROOT / "docs").glob("*.md")}
    seen, todo = set(), deque([(ROOT / "README.md").resolve()])
    while todo:
        page = todo.popleft()
        if page in seen:
            continue
        seen.add(page)
        for target in links(page):
            where = _local(page, target)
            if where and where[0].resolve() in docs:
                todo.append(where[0].resolve())
    unreachable = sorted(_rel(p) for p in docs - seen)
    assert not unreachable, f"not linked from README.md or the pages it reaches: {unreachable}"


def _cited_runs() -> dict[str, list[str]]:
    """Every bench/results entry the pages name: a path under bench/results/, or a dated run
    folder named alone (`commands-20261204-qwen1.5b-brightness`)."""
    cited: dict[str, list[str]] = {}
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        names = re.findall(r"bench/results/([\w.-]++)(?!<)", text)  # not commands-<time>
        names += [m.group(1) for m in RUN.finditer(text)]
        for name in names:
            cited.setdefault(name.rstrip(".-"), []).append(_rel(page))
    return cited


def test_every_cited_run_exists():
    missing = {name: pages for name, pages in _cited_runs().items()
               if not (RESULTS / name).exists()}
    assert not missing, f"cited but not in bench/results: {missing}"


def test_bench_results_keeps_only_cited_runs():
    """Runs of superseded code go (git history keeps them); a run worth keeping is cited."""
    cited = set(_cited_runs())
    kept = {p.name for p in RESULTS.iterdir() if not p.name.startswith(".")}
    uncited = sorted(kept - cited - {"README.md"})
    assert not uncited, f"in bench/results but cited by no page: {uncited}"


def test_each_kept_run_says_how_it_was_run():
    """A README.md in the folder, or its own table's header, names the command and machine."""
    silent = []
    for folder in sorted(p for p in RESULTS.iterdir() if p.is_dir()):
        texts = [p.read_text(encoding="utf-8") for p in folder.glob("*.md")]
        if not any("Command" in t and "Machine" in t for t in texts):
            silent.append(folder.name)
    assert not silent, f"no command and machine (README.md or table header): {silent}"


def test_configuration_reference_lists_every_setting():
    """docs/configuration.md has a row per setting, with its flag and environment variable."""
    page = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `(\w+)` \|.*$", page, re.M)}
    missing = sorted(set(Settings.model_fields) - set(rows))
    assert not missing, f"docs/configuration.md lacks {missing}"
    for name in Settings.model_fields:
        flag, env = f"`--{name.replace('_', '-')}`", f"`HEARTH_{name.upper()}`"
        assert flag in rows[name] and env in rows[name], rows[name]
