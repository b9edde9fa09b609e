"""The checkpoint converter's file layer: errors, atomic writes and a minimal safetensors reader
and writer (numpy; F32 is what it writes)."""
import json
import os
import struct


class ConvertError(Exception):
    pass


def fail(path, message):
    raise ConvertError(f"{path}: {message}")


# ---- safetensors (a minimal reader/writer; F32 only is written) ----------------------------------

def read_safetensors(path):
    import numpy as np
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        fail(path, f"cannot read: {e.strerror}")
    if len(data) < 8:
        fail(path, f"{len(data)} bytes: too short for a safetensors file")
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        fail(path, f"header length {n} runs past the end of the file ({len(data)} bytes)")
    try:
        header = json.loads(data[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        fail(path, f"the safetensors header is not JSON ({e})")
    meta = header.pop("__metadata__", {}) or {}
    dtypes = {"F32": "<f4", "F16": "<f2", "BF16": None, "I32": "<i4", "I64": "<i8", "F64": "<f8"}
    tensors = {}
    for name, info in header.items():
        code = info.get("dtype")
        b, e = info["data_offsets"]
        if 8 + n + e > len(data):
            fail(path, f"tensor '{name}' runs past the end of the file (truncated?)")
        raw = data[8 + n + b:8 + n + e]
        if code == "BF16":
            a = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        elif code in dtypes:
            a = np.frombuffer(raw, dtype=dtypes[code])
        else:
            fail(path, f"tensor '{name}' has dtype {code}, which this converter does not read")
        tensors[name] = a.reshape(info["shape"])
    return tensors, meta


def atomic_write(path, write):
    """write(f) into a temporary sibling, fsync, rename: `path` is the whole file or untouched,
    and no temporary file is left behind whatever fails (ENOSPC, EIO, a write() that raises)."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            fail(path, f"cannot write: {e.strerror or e}")
        raise


def write_safetensors(path, tensors, metadata):
    import numpy as np
    header, blobs, offset = {}, [], 0
    for name, a in tensors.items():
        raw = np.ascontiguousarray(a, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    header["__metadata__"] = metadata
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * ((-(8 + len(h))) % 8)

    def write(f):
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    atomic_write(path, write)
