"""A two-layer cut of a llama-architecture GGUF, for a GPU machine that can take only part of
the real file in one call: enough to load, offload and decode through every code path, not to
answer. Its tensors are the original's token_embd, blk.0 and blk.1 (which such a file stores
first, in one run of bytes) and output_norm.

    python tiny_model.py MODEL HEAD   writes HEAD (the new header, then output_norm's bytes) and
                                      prints START END: the original's bytes that go between them
    then: { head -c H HEAD; tail -c +START+1 MODEL | head -c END-START; tail -c +H+1 HEAD; }
    (H, the header's length, is the third number printed)

Needs gguf-py (llama.cpp's, on PYTHONPATH) and numpy.
"""

from __future__ import annotations

import struct
import sys

import gguf


def main(src: str, out: str) -> None:
    r = gguf.GGUFReader(src)
    kept_blocks = (["blk", "0"], ["blk", "1"])
    keep = [t for t in r.tensors
            if t.name == "token_embd.weight" or t.name.split(".")[:2] in kept_blocks]
    norm = next(t for t in r.tensors if t.name == "output_norm.weight")
    start, end = keep[0].data_offset, keep[-1].data_offset + keep[-1].n_bytes
    if sum(t.n_bytes for t in keep) > end - start or (end - start) % 32:
        raise SystemExit("the kept tensors are not one aligned run of bytes")
    first_info = r.tensors[0].field.offset
    with open(src, "rb") as f:
        raw = f.read(first_info)
        f.seek(norm.data_offset)
        norm_bytes = f.read(norm.n_bytes)
    kv = bytearray(raw[24:first_info])
    blocks = r.fields[f"{r.fields['general.architecture'].contents()}.block_count"]
    at = blocks.offset + sum(len(p.tobytes()) for p in blocks.parts[:-1]) - 24
    struct.pack_into("<I", kv, at, 2)
    infos = bytearray()
    for t in [*keep, norm]:
        name = t.name.encode()
        dims = [int(d) for d in t.shape]
        offset = end - start if t is norm else t.data_offset - start
        infos += struct.pack("<Q", len(name)) + name + struct.pack("<I", len(dims))
        infos += b"".join(struct.pack("<Q", d) for d in dims)
        infos += struct.pack("<IQ", int(t.tensor_type), offset)
    n_kv = struct.unpack_from("<Q", raw, 16)[0]
    head = bytes(raw[:8]) + struct.pack("<QQ", len(keep) + 1, n_kv) + kv + infos
    head += b"\0" * (-len(head) % 32)
    with open(out, "wb") as f:
        f.write(head + norm_bytes)
    print(start, end, len(head))


if __name__ == "__main__":
    main(*sys.argv[1:3])
