"""VecSpace over co-located dense PS vectors: the L-BFGS history lives on the shards.

Every op is one concurrent request per shard that runs there; only scalars come back.
"""

from __future__ import annotations

import itertools

from spark_ps.models import PSVector

__all__ = ["PSVecSpace"]


class PSVecSpace:
    """Dense PS vectors of one dimension (same dim => same shards: co-located)."""

    def __init__(self, context, dim: int, prefix: str):
        self.context, self.dim, self.prefix = context, int(dim), prefix
        self._ids = itertools.count()
        self.live: dict[str, PSVector] = {}

    def new(self, name: str) -> PSVector:
        v = PSVector.dense(
            self.dim, name=f"{self.prefix}/{name}/{next(self._ids)}", context=self.context
        )
        self.live[v.name] = v
        return v

    def copy(self, dst: PSVector, src: PSVector) -> None:
        dst.copy_from(src)

    def axpy(self, a: float, x: PSVector, y: PSVector) -> None:
        y.axpy(a, x)

    def scale(self, a: float, x: PSVector) -> None:
        x.scale(a)

    def dot(self, x: PSVector, y: PSVector) -> float:
        return x.dot(y)

    def nrm2(self, x: PSVector) -> float:
        return x.nrm2()

    def sum(self, x: PSVector) -> float:
        return x.sum()

    def fill(self, x: PSVector, value: float) -> None:
        x.fill(value)

    def apply(self, kernel: str, out: PSVector, *inputs: PSVector, **scalars: float) -> float:
        return out.apply(kernel, *inputs, **scalars)

    def release(self, x: PSVector) -> None:
        self.live.pop(x.name, None)
        x.drop()

    def release_all(self) -> None:
        """Drop every vector still alive (end of a fit, or after a failure)."""
        for v in list(self.live.values()):
            self.release(v)
