#!/usr/bin/env python3
"""Writes the malformed weight files under testdata/bad/weights/ that the param-*.json bad
inputs point at. numpy only; deterministic (running it again gives byte-identical files).

    python3 tools/gen_bad_inputs.py

Every param in testdata/bad/param-*.json declares f32[3,4]; each file below breaks that
promise (or the file format itself) in one way.
"""

import json
import os
import struct

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testdata", "bad", "weights")


def path(name):
    return os.path.join(ROOT, name)


def npy_bytes(arr, fortran=False):
    """The bytes np.save writes for `arr` (Fortran order if asked)."""
    import io

    buf = io.BytesIO()
    np.save(buf, np.asfortranarray(arr) if fortran else np.ascontiguousarray(arr))
    return buf.getvalue()


def safetensors_bytes(tensors):
    """A minimal .safetensors file: u64 LE header length, JSON header, raw LE data."""
    header, data = {}, b""
    for name, arr in tensors.items():
        raw = arr.astype(arr.dtype.newbyteorder("<")).tobytes()
        dtype = {np.dtype("float32"): "F32", np.dtype("int32"): "I32", np.dtype("int64"): "I64", np.dtype("int8"): "I8"}[arr.dtype]
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def bool_bytes_npy():
    """np.save of a bool[3,4] with its element 5 set to the byte 2."""
    raw = bytearray(npy_bytes(np.arange(12).reshape(3, 4) % 3 == 0))
    raw[len(raw) - 12 + 5] = 2
    return bytes(raw)


def main():
    os.makedirs(ROOT, exist_ok=True)
    w = np.arange(12, dtype=np.float32).reshape(3, 4) / 8
    files = {
        # A well-formed f32[3,4]: the reference the broken ones differ from.
        "w.npy": npy_bytes(w),
        # A well-formed f32[2,3] for the input `x` of the param-*.json graphs (tests/all/cli.rs runs
        # `interp` on them to see the param error rather than an input error).
        "x.npy": npy_bytes(np.arange(6, dtype=np.float32).reshape(2, 3)),
        # float64 data where meshc reads f32/i32/i64/bool only.
        "w_f64.npy": npy_bytes(w.astype(np.float64)),
        # int64 data for an f32 param: readable, but the dtype differs from the declaration.
        "w_i64.npy": npy_bytes(np.arange(12, dtype=np.int64).reshape(3, 4)),
        # f32[4,3]: right dtype and element count, transposed shape.
        "w_shape.npy": npy_bytes(w.T.copy()),
        # A valid header for f32[3,4] but only 5 of its 12 values (cut in the data).
        "w_truncated.npy": npy_bytes(w)[: -(12 - 5) * 4],
        # Only the first 6 bytes of the magic string.
        "w_header_only.npy": npy_bytes(w)[:6],
        # Fortran (column-major) order.
        "w_fortran.npy": npy_bytes(w, fortran=True),
        # Not .npy at all: plain text.
        "not_npy.npy": b"w = [[0.0, 0.125, 0.25, 0.375], [0.5, 0.625, 0.75, 0.875], [1.0, 1.125, 1.25, 1.375]]\n",
        # A good .safetensors holding "w" and "b" (the graph asks for "w_missing").
        "model.safetensors": safetensors_bytes({"w": w, "b": np.zeros(4, dtype=np.float32)}),
        # A header length that points far past the end of the file.
        "bad_header.safetensors": struct.pack("<Q", 1 << 20) + b'{"w":',
        # A whole f32[3,4] and then bytes nobody would read.
        "w_trailing.npy": npy_bytes(w) + b"trailing bytes",
        "w_trailing.safetensors": safetensors_bytes({"w": w}) + b"trailing bytes",
        # A version-2 header claiming 4 GiB (a reader that trusts it allocates that much).
        "w_huge_header.npy": b"\x93NUMPY\x02\x00" + struct.pack("<I", 0xFFFFFFF0) + b"{'descr': '<f4'",
        # int8 data (quantized weights) declared an f32 param: the dtypes differ.
        "w_i8.safetensors": safetensors_bytes({"w": np.arange(12, dtype=np.int8).reshape(3, 4)}),
        # A header whose offsets run past the end of the data that follows it.
        "w_offsets.safetensors": safetensors_bytes({"w": w})[:-8],
        # A sharded checkpoint whose index names a shard that is not there (for "b"), beside
        # one that is (for "w").
        "index.safetensors.index.json": json.dumps(
            {"metadata": {"total_size": 64}, "weight_map": {"w": "w-00001-of-00002.safetensors", "b": "b-00002-of-00002.safetensors"}},
            indent=1, sort_keys=True).encode() + b"\n",
        "w-00001-of-00002.safetensors": safetensors_bytes({"w": w}),
        # An index naming shards outside its directory: one up two levels (testdata/README.md,
        # which meshc once read and quoted the first 8 bytes of as a number), one absolute.
        "outside.index.json": json.dumps(
            {"weight_map": {"w": "../../README.md", "w_root": "/etc/passwd"}}, indent=1, sort_keys=True).encode()
        + b"\n",
        # A bool[3,4] whose data holds the byte 2 (numpy writes only 0 and 1; another
        # writer, or a bit flip, may not).
        "c_bool_byte.npy": bool_bytes_npy(),
    }
    for name, data in files.items():
        with open(path(name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
