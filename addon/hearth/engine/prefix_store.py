"""The prefix cache on disk: the household's voice and chat prompts survive a restart.

One file per cached prefix under ``<data_dir>/prefix-cache``, named by a hash of its tokens (an
unchanged entry is never written twice). A file holds a JSON header (what it is valid for: the
model file's identity, the context size, the KV layout, the llama.cpp version; its tokens,
class, hits and age) and llama.cpp's serialised sequence state, with a CRC of both. A file that
does not match this server, is truncated or fails its CRC is skipped with a log line and
removed at the next save: never a crash, never a wrong cache.

Writing happens on a thread of its own: the engine thread only copies a sequence's cells out
(a memcpy) while it is idle, or after it stopped.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
import time
import zlib
from array import array
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("hearth.engine.prefix_store")

MAGIC = b"HEARTH-PREFIX-1\n"
SUFFIX = ".kvstate"
_LEN = struct.Struct("<II")  # header length, CRC32 of header + payload


def name_for(tokens: list[int]) -> str:
    return hashlib.sha256(array("i", tokens).tobytes()).hexdigest()[:32] + SUFFIX


@dataclass
class Saved:
    """One prefix read back from disk."""

    name: str
    tokens: list[int]
    rank: int
    hits: int
    age_s: float  # since its first tokens were cached
    payload: bytes


class PrefixStore:
    def __init__(self, folder: Path, key: dict[str, Any], max_bytes: int):
        self.folder = folder
        self.key = key
        self.max_bytes = max_bytes
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="hearth-prefix-store")
        self.on_disk: dict[str, int] = {}  # name -> bytes, of files this store wrote or read
        self.saves = 0
        self.last_save_s: float | None = None  # how long the last save took
        self.skipped = 0
        self.restored = 0
        self.restore_s: float | None = None

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    # -- writing ---------------------------------------------------------------------------
    def save(self, new: list[tuple[str, dict[str, Any], Any]], keep: list[str]) -> Future:
        """Write ``new`` entries (name, header fields, payload: a bytes-like object the caller
        no longer changes) and remove every file not named in ``keep``, on the writer thread."""
        return self._writer.submit(self._save, new, keep)

    def _save(self, new: list[tuple[str, dict[str, Any], Any]], keep: list[str]) -> None:
        t0 = time.monotonic()
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            log.warning("cannot save the prefix cache to %s: %s", self.folder, e)
            return
        for name, fields, payload in new:
            try:
                self.on_disk[name] = self._write(name, fields, payload)
            except OSError as e:  # a full disk costs the cache, never the server
                log.warning("could not save a cached prefix to %s: %s", self.folder, e)
        wanted = set(keep)
        for path in self.folder.glob("*" + SUFFIX):
            if path.name not in wanted:
                path.unlink(missing_ok=True)
                self.on_disk.pop(path.name, None)
        for tmp in self.folder.glob("*.tmp"):
            tmp.unlink(missing_ok=True)
        self.saves += 1
        self.last_save_s = time.monotonic() - t0

    def _write(self, name: str, fields: dict[str, Any], payload: Any) -> int:
        view = memoryview(payload).cast("B")
        header = json.dumps({"key": self.key, **fields, "payload_bytes": len(view)},
                            separators=(",", ":")).encode()
        crc = zlib.crc32(view, zlib.crc32(header))
        tmp = self.folder / (name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(MAGIC)
            f.write(_LEN.pack(len(header), crc))
            f.write(header)
            f.write(view)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.folder / name)  # a crash mid-write leaves the old file or none
        return len(MAGIC) + _LEN.size + len(header) + len(view)

    def close(self) -> None:
        """Wait for the writes under way."""
        self._writer.shutdown(wait=True)

    # -- reading ---------------------------------------------------------------------------
    def load(self) -> Iterator[Saved]:
        """The valid prefixes on disk, voice before chat, most recently used first."""
        found: list[Saved] = []
        for path in sorted(self.folder.glob("*" + SUFFIX)) if self.folder.is_dir() else []:
            try:
                saved = self._read(path)
            except (OSError, ValueError, KeyError, TypeError, struct.error) as e:
                self.skipped += 1
                log.warning("skipped the saved prefix %s: %s", path.name, e)
                continue
            self.on_disk[path.name] = path.stat().st_size
            found.append(saved)
        found.sort(key=lambda s: (s.rank, s.age_s))
        yield from found

    def _read(self, path: Path) -> Saved:
        raw = path.read_bytes()
        if not raw.startswith(MAGIC):
            raise ValueError("not a Hearth prefix file")
        at = len(MAGIC)
        n_header, crc = _LEN.unpack_from(raw, at)
        at += _LEN.size
        header_raw = raw[at: at + n_header]
        payload = raw[at + n_header:]
        fields = json.loads(header_raw)
        if len(payload) != fields["payload_bytes"]:
            raise ValueError(f"truncated ({len(payload)} of {fields['payload_bytes']} bytes)")
        if zlib.crc32(payload, zlib.crc32(header_raw)) != crc:
            raise ValueError("the checksum does not match (the file is damaged)")
        if fields["key"] != self.key:
            diff = sorted(k for k in {*self.key, *fields["key"]}
                          if self.key.get(k) != fields["key"].get(k))
            raise ValueError(f"saved for another model or context ({', '.join(diff)} differ)")
        tokens = [int(t) for t in fields["tokens"]]
        if path.name != name_for(tokens):
            raise ValueError("its name does not match its tokens")
        return Saved(path.name, tokens, int(fields["rank"]), int(fields["hits"]),
                     max(0.0, time.time() - float(fields["born"])), payload)

    def stats(self) -> dict[str, Any]:
        on_disk = dict(self.on_disk)  # a copy: the writer thread changes it
        return {"enabled": self.enabled, "files": len(on_disk),
                "bytes": sum(on_disk.values()), "max_bytes": self.max_bytes,
                "saves": self.saves, "skipped": self.skipped, "restored": self.restored,
                "restore_ms": (round(1000 * self.restore_s, 1)
                               if self.restore_s is not None else None),
                "last_save_ms": (round(1000 * self.last_save_s, 1)
                                 if self.last_save_s is not None else None)}
