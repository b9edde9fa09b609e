"""Minimal safetensors reader/writer (no dependency on the `safetensors` package).

File layout (https://github.com/huggingface/safetensors, format section):
  8 bytes   little-endian uint64 N = length of the JSON header in bytes
  N bytes   UTF-8 JSON: {name: {"dtype": "F32"|"I32"|..., "shape": [...], "data_offsets": [begin, end]},
                         "__metadata__": {str: str}}
            padded with spaces so that 8 + N is a multiple of 8
  rest      raw little-endian tensor data; offsets are relative to the first byte after the header.
Tensors are written in the order given (dict insertion order), back to back.
"""
import json
import struct

import numpy as np

_DTYPES = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}


def _code(dt):
    for code, d in _DTYPES.items():
        if d.kind == dt.kind and d.itemsize == dt.itemsize:
            return code
    return None


def _to_numpy(t):
    if hasattr(t, "detach"):  # torch tensor
        t = t.detach().cpu().numpy()
    return np.asarray(t)


def save_file(tensors, path, metadata=None):
    """tensors: dict name -> numpy array / torch tensor (F32, I32, ... little-endian)."""
    header = {}
    blobs = []
    offset = 0
    for name, t in tensors.items():
        a = _to_numpy(t)
        code = _code(a.dtype)
        if code is None:
            raise ValueError(f"{name}: unsupported dtype {a.dtype}")
        raw = np.ascontiguousarray(a, dtype=_DTYPES[code]).tobytes()
        header[name] = {"dtype": code, "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    if metadata is not None:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    hbytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    pad = (-(8 + len(hbytes))) % 8
    hbytes += b" " * pad
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hbytes)))
        f.write(hbytes)
        for b in blobs:
            f.write(b)


def load_file(path):
    """Returns (dict name -> numpy array, metadata dict or {}), tensors in header order."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", {}) or {}
    base = 8 + n
    out = {}
    for name, info in header.items():
        dt = _DTYPES[info["dtype"]]
        b, e = info["data_offsets"]
        a = np.frombuffer(data[base + b:base + e], dtype=dt).reshape(info["shape"])
        out[name] = a.copy()
    return out, meta
