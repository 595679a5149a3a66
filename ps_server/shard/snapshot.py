"""A shard's models to and from named arrays: its checkpoint files and the snapshot a
primary streams to a new backup.

The checkpoint directory's layout, manifests and versions are :mod:`ps_server.checkpoint`'s
(shared with the driver, which seals and prunes versions); this module turns a shard's
`Tensor` slices into the arrays those files hold, and back.
"""

from __future__ import annotations

import logging
import re

import numpy as np

from ps_server import checkpoint
from ps_server.proto import ps_pb2 as pb
from ps_server.shard.tensors import Tensor

__all__ = ["model_arrays", "models_from_arrays", "save_shard", "load_shard", "restore_latest"]

log = logging.getLogger("ps_server.shard.snapshot")
_MODEL = re.compile(r"^m\d+\.")


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
    return checkpoint.save_arrays(uri, version, index, model_arrays(models))


def load_shard(uri: str, version: int, index: int) -> dict:
    """Read one shard's slices of a sealed version back into Tensors."""
    return models_from_arrays(checkpoint.load_arrays(uri, version, index))


def restore_latest(uri: str, index: int) -> tuple[dict, int] | None:
    """(models, version) of the newest sealed version whose file for shard `index` loads,
    or None if no version is sealed.

    A sealed version whose file is missing or unreadable is skipped with an error naming
    it, so a restarted shard comes back from the previous one instead of crashing on it at
    every restart; if none loads, RuntimeError names each version and why."""
    versions = checkpoint.sealed_versions(uri)
    failures = []
    for version in reversed(versions):
        try:
            return load_shard(uri, version, index), version
        except Exception as e:  # noqa: BLE001 - any unreadable file: try the previous one
            failures.append(f"v{version}: {type(e).__name__}: {e}")
            log.error("shard %d: checkpoint %s v%d does not load (%s)", index, uri, version, e)
    if failures:
        raise RuntimeError(
            f"shard {index}: no sealed checkpoint version under {uri} loads: " + "; ".join(failures)
        )
    return None
