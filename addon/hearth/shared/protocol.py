"""What the server and a model's worker process say to each other (both sides import this;
nothing here loads llama.cpp).

Two socket pairs join them, each message one pickled tuple:

- the **engine channel**, used only by the server's engine thread, strictly one request and
  one reply: ``(deferred, op, args)`` -> ``("ok", value)`` or ``("err", message)``. Calls whose
  result the engine never reads (``seq_rm``, ``seq_cp``, ``free_sampler``) are not sent alone:
  they wait in ``deferred`` for the next call, which the worker runs after them, in order. An
  iteration is so one round trip: ``decode_sample`` decodes, samples every output and returns
  each token with its text and end-of-generation flag.
- the **service channel**, for any server thread: ``(id, op, args)`` -> ``(id, "ok"|"err",
  value)``, answered out of order by the worker's service threads (tokenizing a long prompt
  never waits for a decode, nor a decode for it).

At start the worker sends ``("rung", rung)`` as soon as it knows which CPU variant it will
run (so a crash after it is charged to that rung), then ``("ready", info)`` after its canary
decode, or ``("failed", message)`` for an error that is not a crash (a missing file).

A decode is stopped from outside through two bytes of shared memory (:class:`AbortFlag`) that
llama.cpp's abort callback reads at every graph node: no message, no wait for the worker.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

ENGINE_OPS = ("decode_sample", "draft", "new_sampler", "seq_pos_max", "seq_state_get",
              "seq_state_set", "embed", "embed_piece", "token_info", "sync", "normal_priority",
              "exit")
DEFERRED_OPS = ("seq_rm", "seq_cp", "free_sampler")
SERVICE_OPS = ("tokenize", "tokenize_pieces", "check_grammar", "ping")



@dataclass
class ContextParams:
    """A llama.cpp context's sizes, as the server asks a worker for them."""

    n_ctx: int = 16384
    n_seq_max: int = 8
    n_batch: int = 512
    n_ubatch: int = 128
    n_threads: int = 0
    flash_attn: str = "auto"  # auto | on | off
    embeddings: bool = False
    kv_unified: bool = True


# The environment variable that names test faults a worker injects into itself (tests only;
# see hearth.runner.faults).
FAULT_ENV = "HEARTH_WORKER_FAULT"


class AbortFlag:
    """A few bytes in a shared file in memory. Bytes 0-1: "0"/"1" and a NUL, the form
    llama.cpp's abort callback (libc's atoi) reads. Bytes 8-15: the sampler the worker is
    sampling with (0: none), written before each sample, so that when a worker dies there
    the server knows which request killed it rather than blaming the whole batch."""

    SIZE = 16

    def __init__(self, path: str | None = None):
        if path is None:
            folder = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
            fd, path = tempfile.mkstemp(prefix="hearth-worker-", dir=folder)
            os.write(fd, b"0".ljust(self.SIZE, b"\0"))
            self.owner = True
        else:
            fd = os.open(path, os.O_RDWR)
            self.owner = False
        self.path = path
        self._map = mmap.mmap(fd, self.SIZE)
        os.close(fd)
        self.array = (ctypes.c_char * 2).from_buffer(self._map)

    def set(self) -> None:
        self._map[0:1] = b"1"

    def clear(self) -> None:
        self._map[0:1] = b"0"

    @property
    def blame(self) -> int:
        return struct.unpack_from("<q", self._map, 8)[0]

    @blame.setter
    def blame(self, sampler: int) -> None:
        struct.pack_into("<q", self._map, 8, sampler)

    def close(self) -> None:
        """The server's, once the worker has it open: remove the file (the mappings live on
        in both processes, and none is left behind if the server is killed)."""
        if self.owner:
            Path(self.path).unlink(missing_ok=True)
