"""Atomic shard snapshots: write to a temp file, fsync, rename; a manifest seals a version.

Layout under a checkpoint directory (a local path or any `pyarrow.fs` URI)::

    v000012/shard-0.npz ... shard-{n-1}.npz   one file per shard
    v000012/MANIFEST.json                      written last, by whoever asked for the snapshot

A version without a manifest is torn (a crash mid-write) and is never loaded.
"""

from __future__ import annotations

import io
import json
import os
import re

import numpy as np
from pyarrow import fs as pafs

from ps_server.proto import ps_pb2 as pb
from ps_server.wire import RequestError

__all__ = [
    "model_arrays",
    "models_from_arrays",
    "save_shard",
    "load_shard",
    "write_manifest",
    "latest_version",
    "restore_latest",
]

_VERSION = re.compile(r"^v(\d{6,})$")
_MODEL = re.compile(r"^m\d+\.")


def _fs(uri: str) -> tuple[pafs.FileSystem, str]:
    if not uri:
        raise RequestError("INVALID_ARGUMENT", "checkpoint uri must not be empty")
    if "://" not in uri:
        return pafs.LocalFileSystem(), os.path.abspath(uri)
    return pafs.FileSystem.from_uri(uri)


def _write_atomic(filesystem: pafs.FileSystem, path: str, data: bytes) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    if isinstance(filesystem, pafs.LocalFileSystem):
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dir_fd = os.open(os.path.dirname(path), os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        return
    with filesystem.open_output_stream(tmp) as out:
        out.write(data)
    filesystem.move(tmp, path)


def _vdir(root: str, version: int) -> str:
    return f"{root}/v{version:06d}"


def model_arrays(models: dict) -> dict[str, np.ndarray]:
    """Every model slice (spec, weights, optimizer state) as named plain arrays (no pickle).

    Shared by checkpoints and by the snapshot a primary streams to a new backup.
    """
    arrays: dict[str, np.ndarray] = {}
    for i, (_name, tensor) in enumerate(sorted(models.items())):
        with tensor.lock:
            state = tensor.store.state()
        arrays[f"m{i}.spec"] = np.frombuffer(tensor.spec.SerializeToString(), dtype=np.uint8)
        for key, value in state.items():
            arrays[f"m{i}.{key}"] = np.asarray(value)
    return arrays


def models_from_arrays(data) -> dict:
    """Tensors back from `model_arrays` output (a dict or an `np.load` result)."""
    from ps_server.tensors import Tensor

    names = list(data.keys()) if isinstance(data, dict) else data.files
    models = {}
    for prefix in sorted({k.split(".", 1)[0] for k in names if _MODEL.match(k)}):
        spec = pb.ModelSpec()
        spec.ParseFromString(data[f"{prefix}.spec"].tobytes())
        state = {
            k.split(".", 1)[1]: data[k]
            for k in names
            if k.startswith(prefix + ".") and k != f"{prefix}.spec"
        }
        models[spec.name] = Tensor.from_state(spec, state)
    return models


def save_shard(uri: str, version: int, index: int, models: dict) -> tuple[str, int]:
    """Snapshot every model slice (weights and optimizer state) of one shard."""
    filesystem, root = _fs(uri)
    vdir = _vdir(root, version)
    filesystem.create_dir(vdir, recursive=True)
    buf = io.BytesIO()
    np.savez(buf, **model_arrays(models))
    path = f"{vdir}/shard-{index}.npz"
    _write_atomic(filesystem, path, buf.getvalue())
    return path, buf.tell()


def load_shard(uri: str, version: int, index: int) -> dict:
    """Read one shard's slices of a sealed version back into Tensors."""
    filesystem, root = _fs(uri)
    if not _sealed(filesystem, root, version):
        raise RequestError("NOT_FOUND", f"checkpoint {uri} v{version}: no manifest (torn?)")
    with filesystem.open_input_file(f"{_vdir(root, version)}/shard-{index}.npz") as f:
        data = np.load(io.BytesIO(f.read()), allow_pickle=False)
    return models_from_arrays(data)


def write_manifest(uri: str, version: int, num_shards: int, extra: dict | None = None) -> None:
    """Seal a version once every shard has written its file."""
    filesystem, root = _fs(uri)
    body = {"version": version, "num_shards": num_shards, **(extra or {})}
    _write_atomic(filesystem, f"{_vdir(root, version)}/MANIFEST.json", json.dumps(body).encode())


def _sealed(filesystem: pafs.FileSystem, root: str, version: int) -> bool:
    info = filesystem.get_file_info(f"{_vdir(root, version)}/MANIFEST.json")
    return info.type == pafs.FileType.File


def latest_version(uri: str) -> int | None:
    """The newest sealed version under `uri`, or None."""
    filesystem, root = _fs(uri)
    if filesystem.get_file_info(root).type != pafs.FileType.Directory:
        return None
    versions = []
    for info in filesystem.get_file_info(pafs.FileSelector(root)):
        m = _VERSION.match(info.base_name)
        if m and _sealed(filesystem, root, int(m.group(1))):
            versions.append(int(m.group(1)))
    return max(versions, default=None)


def restore_latest(uri: str, index: int) -> tuple[dict, int] | None:
    """(models, version) of the newest sealed version, or None if there is none."""
    version = latest_version(uri)
    if version is None:
        return None
    return load_shard(uri, version, index), version
