"""Read a PyTorch .pt checkpoint without running any code from it.

A .pt file is a pickle, and a pickle is a program: torch.load(weights_only=False) runs whatever
callable the file names. This reader parses the pickle with an unpickler that resolves only the
names a fairseq or official Luna checkpoint contains, each to a function of this module that
builds data (never to the named library function), and refuses every other name with one line
naming it. Tensors come back as numpy arrays, read from the file's own storage records with their
bounds checked. It needs numpy only, so it behaves the same under every PyTorch version (Debian's
1.13 has no torch.serialization.add_safe_globals; torch >= 2.6's weights_only=True refuses the
argparse.Namespace that fairseq pickles).

What is allowed (module.name in the pickle -> what this reader builds):
  torch._utils._rebuild_tensor_v2, _rebuild_tensor,
  _rebuild_parameter, _rebuild_parameter_with_state     -> numpy.ndarray (a copy, bounds checked)
  torch.{Float,Double,Half,BFloat16,Long,Int,Short,Char,
         Byte,Bool}Storage                                -> the element type of a storage record
  collections.OrderedDict                                 -> collections.OrderedDict
  argparse.Namespace                                      -> argparse.Namespace (fairseq's args)
  copyreg._reconstructor, builtins.object (protocol 0/1) -> only for the two classes above
  builtins.set, builtins.frozenset                        -> set, frozenset
  _codecs.encode(str, 'latin1') (protocol 2's bytes)      -> bytes
  numpy scalars (numpy[._]core.multiarray.scalar with
    numpy.dtype of a number kind)                         -> a numpy number (fairseq's meters)
Plain containers and scalars (dict, list, tuple, str, bytes, int, float, bool, None) need no name.
Not allowed, because no checkpoint of fairseq >= 0.10 or of the official Luna code carries
them: omegaconf objects (fairseq's trainer stores cfg through OmegaConf.to_container), numpy
arrays, quantized or sparse tensors, any other class or function.

Formats: the zip container (torch >= 1.6: <root>/data.pkl + <root>/data/<key>) and the legacy
stream (magic number, protocol, system info, the object, the storage keys, the storages).
"""
import _compat_pickle
import argparse
import collections
import io
import os
import pickle
import struct
import zipfile

import numpy as np

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
LEGACY_PROTOCOL = 1001

# storage type -> (numpy dtype of the stored bytes, element size)
STORAGE_TYPES = {
    "FloatStorage": "<f4", "DoubleStorage": "<f8", "HalfStorage": "<f2", "BFloat16Storage": "<u2",
    "LongStorage": "<i8", "IntStorage": "<i4", "ShortStorage": "<i2", "CharStorage": "i1",
    "ByteStorage": "u1", "BoolStorage": "?",
}


class PtError(Exception):
    """The file is not a checkpoint this reader accepts; str() is one line."""


class _StorageType:
    def __init__(self, name):
        self.name = name
        self.dtype = np.dtype(STORAGE_TYPES[name])


class _Storage:
    """A storage record: its element type and its bytes (read when a tensor uses it)."""

    def __init__(self, stype, numel, read):
        self.stype, self.numel, self._read, self._data = stype, numel, read, None

    def array(self):
        if self._data is None:
            raw = self._read()
            want = self.numel * self.stype.dtype.itemsize
            if len(raw) != want:
                raise PtError(f"a {self.stype.name} of {self.numel} elements holds {len(raw)} bytes, "
                              f"not {want} (truncated or damaged file)")
            self._data = np.frombuffer(raw, dtype=self.stype.dtype)
        return self._data


def _int(x, what):
    if type(x) is not int:
        raise PtError(f"a tensor's {what} is {type(x).__name__}, not an integer")
    return x


class _Pending:
    """A tensor whose storage bytes may not have been read yet (the legacy format stores them
    after the object): made into an array by _resolve once the whole file is read."""

    def __init__(self, storage, offset, size, stride):
        self.storage, self.offset, self.size, self.stride = storage, offset, size, stride

    def array(self):
        storage, offset, size, stride = self.storage, self.offset, self.size, self.stride
        data = storage.array()
        count = int(np.prod(size, dtype=np.int64)) if size else 1
        if count > 0:
            last = offset + sum((n - 1) * s for n, s in zip(size, stride))
            if last >= storage.numel:
                raise PtError(f"a tensor of size {list(size)} (offset {offset}, stride {list(stride)}) "
                              f"reads past its storage of {storage.numel} elements")
            item = data.itemsize
            view = np.lib.stride_tricks.as_strided(data[offset:], shape=size,
                                                   strides=tuple(s * item for s in stride), writeable=False)
        else:
            view = np.zeros(size, dtype=data.dtype)
        out = np.array(view, copy=True)
        if storage.stype.name == "BFloat16Storage":
            out = (out.astype(np.uint32) << 16).view(np.float32)
        return out


def _rebuild_tensor_v2(storage, offset, size, stride, requires_grad=False, hooks=None, metadata=None):
    if not isinstance(storage, _Storage):
        raise PtError(f"a tensor is built from a {type(storage).__name__}, not a storage")
    offset = _int(offset, "storage offset")
    if not isinstance(size, tuple) or not isinstance(stride, tuple) or len(size) != len(stride):
        raise PtError("a tensor's size and stride are not tuples of the same length")
    size = tuple(_int(s, "size") for s in size)
    stride = tuple(_int(s, "stride") for s in stride)
    if offset < 0 or any(s < 0 for s in size) or any(s < 0 for s in stride):
        raise PtError(f"a tensor has a negative offset, size or stride ({offset}, {size}, {stride})")
    return _Pending(storage, offset, size, stride)


def _resolve(obj):
    """obj with every _Pending replaced by its array (containers updated in place)."""
    if isinstance(obj, _Pending):
        return obj.array()
    if isinstance(obj, dict):
        for k in list(obj):
            obj[k] = _resolve(obj[k])
    elif isinstance(obj, list):
        obj[:] = [_resolve(x) for x in obj]
    elif isinstance(obj, tuple):
        return tuple(_resolve(x) for x in obj)
    elif isinstance(obj, argparse.Namespace):
        for k, v in list(vars(obj).items()):
            setattr(obj, k, _resolve(v))
    return obj


def _rebuild_tensor(storage, offset, size, stride):
    return _rebuild_tensor_v2(storage, offset, size, stride)


def _rebuild_parameter(data, requires_grad=False, hooks=None, state=None):
    if not isinstance(data, _Pending):
        raise PtError(f"a parameter wraps a {type(data).__name__}, not a tensor")
    return data


class _Dtype:
    """numpy.dtype as named by a pickled numpy scalar: number kinds only; its pickled state
    (byte order, flags) is checked, not applied."""

    def __init__(self, code, align=False, copy=True):
        if not isinstance(code, str) or np.dtype(code).kind not in "biuf" or np.dtype(code).hasobject:
            raise PtError(f"numpy.dtype({code!r}): only number types are read")
        self.dtype = np.dtype(code)

    def __setstate__(self, state):
        if not isinstance(state, tuple) or len(state) < 2 or state[1] not in ("<", ">", "|", "="):
            raise PtError("a numpy dtype with an unexpected pickled state")
        self.dtype = self.dtype.newbyteorder(state[1]) if state[1] in "<>" else self.dtype


def _numpy_scalar(dtype, data=None):
    if not isinstance(dtype, _Dtype) or not isinstance(data, bytes) or len(data) != dtype.dtype.itemsize:
        raise PtError("a numpy scalar with an unexpected pickled form")
    return np.frombuffer(data, dtype=dtype.dtype)[0]


def _codecs_encode(text, encoding="utf-8"):
    """Protocol 2's form of a bytes object: _codecs.encode(str, 'latin1')."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise PtError("_codecs.encode other than protocol 2's bytes (str, 'latin1')")
    return text.encode("latin1")


def _reconstructor(cls, base, state):
    if cls not in (collections.OrderedDict, argparse.Namespace) or base is not object or state is not None:
        raise PtError(f"copyreg._reconstructor of {getattr(cls, '__name__', type(cls).__name__)}")
    return cls.__new__(cls)


ALLOWED = {
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
    ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("argparse", "Namespace"): argparse.Namespace,
    ("copyreg", "_reconstructor"): _reconstructor,
    ("builtins", "object"): object,  # _reconstructor's base class
    ("_codecs", "encode"): _codecs_encode,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("numpy", "dtype"): _Dtype,
    ("numpy.core.multiarray", "scalar"): _numpy_scalar,
    ("numpy._core.multiarray", "scalar"): _numpy_scalar,
}


class _Unpickler(pickle.Unpickler):
    def __init__(self, f, storages):
        super().__init__(f)
        self._storages = storages  # persistent id -> _Storage, filled by the format reader

    def find_class(self, module, name):
        # protocols 0-2 write Python 2 names (__builtin__, copy_reg): read them as pickle does
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        elif module in _compat_pickle.IMPORT_MAPPING:
            module = _compat_pickle.IMPORT_MAPPING[module]
        if module == "torch" and name in STORAGE_TYPES:
            return _StorageType(name)
        fn = ALLOWED.get((module, name))
        if fn is None:
            raise PtError(f"the pickle names '{module}.{name}', which a checkpoint does not contain: "
                          "refused (loading it would run code from the file)")
        return fn

    def persistent_load(self, pid):
        return self._storages(pid)


def _storage_record(pid):
    if not isinstance(pid, tuple) or len(pid) < 5 or pid[0] != "storage":
        raise PtError(f"an unexpected persistent record {str(pid)[:60]}")
    stype, key, numel = pid[1], pid[2], pid[4]
    if not isinstance(stype, _StorageType):
        raise PtError(f"a storage of type {type(stype).__name__}")
    if not isinstance(key, str) or not key.isalnum() or type(numel) is not int or numel < 0:
        raise PtError(f"a storage record with key {str(key)[:40]!r} and size {str(numel)[:20]}")
    return stype, key, numel


def _load_zip(path, zf):
    names = zf.namelist()
    pkl = [n for n in names if n.endswith("/data.pkl") and n.count("/") == 1]
    if len(pkl) != 1:
        raise PtError("a zip file without exactly one <root>/data.pkl: not a PyTorch checkpoint")
    root = pkl[0][: -len("data.pkl")]
    storages = {}

    def storage(pid):
        stype, key, numel = _storage_record(pid)
        if key not in storages:
            name = f"{root}data/{key}"
            if name not in names:
                raise PtError(f"storage '{key}' is not in the file")
            if zf.getinfo(name).file_size != numel * stype.dtype.itemsize:
                raise PtError(f"storage '{key}' holds {zf.getinfo(name).file_size} bytes, not the "
                              f"{numel * stype.dtype.itemsize} of {numel} {stype.name} elements")
            storages[key] = _Storage(stype, numel, lambda: zf.read(name))
        return storages[key]
    return _Unpickler(io.BytesIO(zf.read(pkl[0])), storage).load()


def _load_legacy(f, size):
    def header(what, want=None):
        try:
            value = _Unpickler(f, lambda pid: (_ for _ in ()).throw(PtError("a storage in a header"))).load()
        except (EOFError, pickle.UnpicklingError, ValueError, TypeError, IndexError) as e:
            raise PtError(f"not a PyTorch checkpoint ({what}: {type(e).__name__})")
        if want is not None and value != want:
            raise PtError(f"not a PyTorch checkpoint (its {what} is {str(value)[:40]})")
        return value
    header("magic number", LEGACY_MAGIC)
    header("protocol version", LEGACY_PROTOCOL)
    info = header("system information")
    if not isinstance(info, dict) or info.get("little_endian") is not True:
        raise PtError("a legacy checkpoint written on a big-endian machine or without system information")
    records = {}

    def storage(pid):
        stype, key, numel = _storage_record(pid)
        view = pid[5] if len(pid) > 5 else None
        if key not in records:
            records[key] = _Storage(stype, numel, None)
        s = records[key]
        if view is None:
            return s
        if (not isinstance(view, tuple) or len(view) != 3 or type(view[1]) is not int
                or type(view[2]) is not int or view[1] < 0 or view[2] < 0 or view[1] + view[2] > numel):
            raise PtError(f"a storage view {str(view)[:60]} outside its storage of {numel} elements")
        return _Storage(stype, view[2], lambda: s.array()[view[1]:view[1] + view[2]].tobytes())
    obj = _Unpickler(f, storage).load()
    keys = header("storage keys")
    if not isinstance(keys, list) or sorted(keys) != sorted(records):
        raise PtError("the storage keys after the object do not match the storages it uses")
    for key in keys:
        s = records[key]
        raw = f.read(8)
        if len(raw) != 8:
            raise PtError(f"storage '{key}' is missing (truncated file)")
        (n,) = struct.unpack("<q", raw)
        if n != s.numel:
            raise PtError(f"storage '{key}' has {n} elements in the file, {s.numel} in the pickle")
        if n * s.stype.dtype.itemsize > size - f.tell():
            raise PtError(f"storage '{key}' runs past the end of the file (truncated?)")
        data = f.read(n * s.stype.dtype.itemsize)
        s._read = lambda data=data: data
    return obj


def load(path):
    """The checkpoint at `path` as plain Python data with numpy arrays for tensors. Raises
    PtError (one line) for anything else, OSError when the file cannot be read."""
    with open(path, "rb") as f:
        head = f.read(4)
        f.seek(0)
        try:
            if head == b"PK\x03\x04":
                with zipfile.ZipFile(f) as zf:
                    return _resolve(_load_zip(path, zf))
            return _resolve(_load_legacy(f, os.fstat(f.fileno()).st_size))
        except PtError:
            raise
        except (pickle.UnpicklingError, zipfile.BadZipFile, EOFError, ValueError, TypeError,
                AttributeError, IndexError, KeyError, struct.error, MemoryError, RecursionError) as e:
            msg = str(e).splitlines()[0][:120] if str(e) else ""
            raise PtError(f"not a readable PyTorch checkpoint ({type(e).__name__}{': ' + msg if msg else ''})")
