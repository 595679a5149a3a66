"""Atomic shard snapshots: write to a temp file, fsync, rename; a manifest seals a version.

Layout under a checkpoint directory (a local path or any `pyarrow.fs` URI)::

    v000012/shard-0.npz ... shard-{n-1}.npz   one file per shard
    v000012/MANIFEST.json                      written last, by whoever asked for the snapshot

A version without a manifest is torn (a crash mid-write) and is never loaded.
:func:`prune` keeps the newest sealed versions and removes torn ones, so a fit that
checkpoints every few iterations does not fill the disk. Local files are written
owner-only (0600, directories 0700): they hold the model's weights.
"""

from __future__ import annotations

import io
import json
import os
import re
import uuid

import numpy as np
from pyarrow import fs as pafs

from ps_server.wire import RequestError

__all__ = [
    "save_arrays",
    "load_arrays",
    "write_manifest",
    "read_manifest",
    "sealed_versions",
    "latest_version",
    "prune",
    "check_under_roots",
]

_VERSION = re.compile(r"^v(\d{6,})$")


def _normalized(uri: str) -> str:
    if "://" in uri:
        return uri.rstrip("/")
    return os.path.realpath(os.path.abspath(uri))


def check_under_roots(uri: str, roots: list[str] | None, where: str) -> None:
    """Refuse a checkpoint URI outside `roots` (None: any is allowed).

    A checkpoint request names its URI over the network and the shard writes there with
    its own credentials (any pyarrow filesystem), so a PS serving other hosts writes only
    under the directories its operator gave it."""
    if roots is None:
        return
    target = _normalized(uri)
    for root in roots:
        base = _normalized(root)
        sep = "/" if "://" in base else os.sep
        if target == base or target.startswith(base.rstrip(sep) + sep):
            return
    raise RequestError(
        "PERMISSION_DENIED",
        f"{where}: checkpoint URI {uri!r} is outside the allowed "
        + (f"roots {roots}" if roots else "roots (none: this PS has no checkpoint directory)")
        + "; start the service with --checkpoint-dir set to a directory that holds it",
    )


def _fs(uri: str) -> tuple[pafs.FileSystem, str]:
    if not uri:
        raise RequestError("INVALID_ARGUMENT", "checkpoint uri must not be empty")
    if "://" not in uri:
        return pafs.LocalFileSystem(), os.path.abspath(uri)
    return pafs.FileSystem.from_uri(uri)


def _write_atomic(filesystem: pafs.FileSystem, path: str, data: bytes) -> None:
    # unique per writer (two threads of one process may write one version's file), and
    # removed if the write fails, so a failed checkpoint leaves no temp file behind
    tmp = f"{path}.tmp-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    local = isinstance(filesystem, pafs.LocalFileSystem)
    try:
        if local:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        else:
            with filesystem.open_output_stream(tmp) as out:
                out.write(data)
            filesystem.move(tmp, path)
    except BaseException:
        _remove(filesystem, tmp)
        raise
    if local:
        dir_fd = os.open(os.path.dirname(path), os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _remove(filesystem: pafs.FileSystem, path: str) -> None:
    try:
        filesystem.delete_file(path)
    except (FileNotFoundError, OSError):
        pass


def _make_dir(filesystem: pafs.FileSystem, path: str) -> None:
    if isinstance(filesystem, pafs.LocalFileSystem):
        os.makedirs(path, mode=0o700, exist_ok=True)  # the weights are nobody else's
    else:
        filesystem.create_dir(path, recursive=True)


def _vdir(root: str, version: int) -> str:
    return f"{root}/v{version:06d}"


def save_arrays(uri: str, version: int, index: int, arrays: dict) -> tuple[str, int]:
    """Write one shard's arrays (``ps_server.shard.snapshot.model_arrays``, taken as a
    consistent cut) as its file of `version`; returns the path and the bytes written."""
    filesystem, root = _fs(uri)
    vdir = _vdir(root, version)
    _make_dir(filesystem, vdir)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    path = f"{vdir}/shard-{index}.npz"
    _write_atomic(filesystem, path, buf.getvalue())
    return path, buf.tell()


def load_arrays(uri: str, version: int, index: int):
    """Read shard `index`'s file of a sealed version (an `np.load` result, no pickle)."""
    filesystem, root = _fs(uri)
    if not _sealed(filesystem, root, version):
        raise RequestError("NOT_FOUND", f"checkpoint {uri} v{version}: no manifest (torn?)")
    with filesystem.open_input_file(f"{_vdir(root, version)}/shard-{index}.npz") as f:
        return np.load(io.BytesIO(f.read()), allow_pickle=False)


def write_manifest(uri: str, version: int, num_shards: int, extra: dict | None = None) -> None:
    """Seal a version once every shard has written its file."""
    filesystem, root = _fs(uri)
    body = {"version": version, "num_shards": num_shards, **(extra or {})}
    _write_atomic(filesystem, f"{_vdir(root, version)}/MANIFEST.json", json.dumps(body).encode())


def _sealed(filesystem: pafs.FileSystem, root: str, version: int) -> bool:
    info = filesystem.get_file_info(f"{_vdir(root, version)}/MANIFEST.json")
    return info.type == pafs.FileType.File


def read_manifest(uri: str, version: int) -> dict:
    """The manifest of a sealed version (its `extra` fields included)."""
    filesystem, root = _fs(uri)
    with filesystem.open_input_file(f"{_vdir(root, version)}/MANIFEST.json") as f:
        return json.loads(f.read())


def _versions(filesystem: pafs.FileSystem, root: str) -> dict[int, bool]:
    """Every version directory under `root`: version -> sealed."""
    if filesystem.get_file_info(root).type != pafs.FileType.Directory:
        return {}
    found = {}
    for info in filesystem.get_file_info(pafs.FileSelector(root)):
        m = _VERSION.match(info.base_name)
        if m and info.type == pafs.FileType.Directory:
            found[int(m.group(1))] = _sealed(filesystem, root, int(m.group(1)))
    return found


def sealed_versions(uri: str) -> list[int]:
    """Every sealed version under `uri`, oldest first (torn ones are skipped)."""
    filesystem, root = _fs(uri)
    return sorted(v for v, sealed in _versions(filesystem, root).items() if sealed)


def prune(uri: str, keep: int, all_torn: bool = False) -> list[int]:
    """Delete sealed versions but the newest `keep` (0 keeps them all), and torn ones older
    than the newest sealed version (every torn one with `all_torn`: at start-up, when no
    checkpoint can be in progress). Returns the versions deleted, oldest first.

    The newest sealed version is never deleted, so a restore always has one; a torn version
    newer than it may be a checkpoint still being written and is left alone."""
    if keep < 0:
        raise ValueError(f"checkpoint prune: keep must be >= 0, got {keep}")
    filesystem, root = _fs(uri)
    found = _versions(filesystem, root)
    sealed = sorted(v for v, ok in found.items() if ok)
    newest = sealed[-1] if sealed else None
    doomed = set(sealed[:-keep]) if keep else set()
    doomed |= {
        v for v, ok in found.items() if not ok and (all_torn or (newest is not None and v < newest))
    }
    for version in sorted(doomed):
        try:
            filesystem.delete_dir(_vdir(root, version))
        except (FileNotFoundError, OSError):  # another pruner got there first
            pass
    return sorted(doomed)


def latest_version(uri: str) -> int | None:
    """The newest sealed version under `uri`, or None."""
    versions = sealed_versions(uri)
    return versions[-1] if versions else None
