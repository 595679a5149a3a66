"""What a tensor is, client-side: a small picklable description plus its routing."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ps_server.keys import (
    combine_by_shard,
    dedup_by_shard,
    group_by,
    group_by_shard,
    hash_shard,
    is_strictly_increasing,
    range_bounds,
    range_shard,
)
from ps_server.proto import ps_pb2 as pb

__all__ = ["TensorSpec"]


@dataclass(frozen=True)
class TensorSpec:
    """A named, sharded tensor. Dense: range-partitioned; sparse: int64 keys, hash-partitioned.

    Dense tensors of the same `dim` share their range bounds, so index *i* of every
    one of them lives on the same shard (co-location for server-side vector ops).
    """

    name: str
    kind: str  # "dense" | "sparse"
    dim: int
    cols: int
    num_shards: int
    dtype: str = "float64"
    init: str = "zeros"
    init_scale: float = 0.0
    seed: int = 0
    optimizer: str = ""
    opt_params: tuple[tuple[str, float], ...] = field(default=())
    create_on_pull: bool = False
    budget_bytes: int = 0  # per shard slice; 0 = no budget
    nan_policy: str = "refuse"  # or "skip": rows holding NaN/inf are dropped from a push

    def bounds(self) -> np.ndarray:
        return range_bounds(self.dim, self.num_shards)

    def shard_of(self, keys: np.ndarray) -> np.ndarray:
        if self.kind == "dense":
            return range_shard(keys, self.bounds())
        return hash_shard(keys, self.num_shards)

    def route(self, keys: np.ndarray) -> list[np.ndarray | slice]:
        """Positions of `keys` owned by each shard (stable order within a shard).

        Sorted keys of a dense tensor split into contiguous slices: no sort, no copy.
        """
        if self.kind == "dense" and is_strictly_increasing(keys):
            cut = np.searchsorted(keys, self.bounds())
            return [slice(int(cut[s]), int(cut[s + 1])) for s in range(self.num_shards)]
        order, offsets = group_by(self.shard_of(keys), self.num_shards)
        return [order[offsets[s] : offsets[s + 1]] for s in range(self.num_shards)]

    def _route_bounds(self) -> np.ndarray | None:
        return self.bounds() if self.kind == "dense" else None

    def group(self, keys: np.ndarray) -> tuple[np.ndarray | None, np.ndarray]:
        """Positions of `keys` grouped by shard: (order or None for "as they are", offsets);
        see ``ps_server.keys.group_by_shard``."""
        if self.kind == "dense" and is_strictly_increasing(keys):
            return None, np.searchsorted(keys, self.bounds()).astype(np.int64)
        return group_by_shard(keys, self.num_shards, self._route_bounds())

    def combine(
        self, keys: np.ndarray, values: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Unique keys, equal keys' values summed, grouped by shard (keys, values, offsets)."""
        return combine_by_shard(keys, values, self.num_shards, self._route_bounds())

    def dedup(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Unique keys grouped by shard, offsets, and the inverse map (None: identity)."""
        return dedup_by_shard(keys, self.num_shards, self._route_bounds())

    def shard_spec(self, shard: int) -> pb.ModelSpec:
        offset = length = 0
        if self.kind == "dense":
            b = self.bounds()
            offset, length = int(b[shard]), int(b[shard + 1] - b[shard])
        return pb.ModelSpec(
            name=self.name,
            kind=self.kind,
            dim=self.dim,
            cols=self.cols,
            dtype=self.dtype,
            offset=offset,
            length=length,
            init=self.init,
            init_scale=self.init_scale,
            seed=self.seed,
            optimizer=self.optimizer,
            opt_params=dict(self.opt_params),
            create_on_pull=self.create_on_pull,
            num_shards=self.num_shards,
            budget_bytes=self.budget_bytes,
            nan_policy=self.nan_policy,
        )

    def global_spec(self) -> pb.ModelSpec:
        spec = self.shard_spec(0)
        spec.offset = spec.length = 0
        return spec

    @classmethod
    def from_global(cls, spec: pb.ModelSpec) -> TensorSpec:
        return cls(
            name=spec.name,
            kind=spec.kind,
            dim=spec.dim,
            cols=spec.cols,
            num_shards=spec.num_shards,
            dtype=spec.dtype,
            init=spec.init,
            init_scale=spec.init_scale,
            seed=spec.seed,
            optimizer=spec.optimizer,
            opt_params=tuple(sorted(spec.opt_params.items())),
            create_on_pull=spec.create_on_pull,
            budget_bytes=spec.budget_bytes,
            nan_policy=spec.nan_policy or "refuse",
        )
