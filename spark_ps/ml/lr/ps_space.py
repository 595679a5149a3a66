"""VecSpace over co-located dense PS vectors: the L-BFGS history lives on the shards.

Every op is one concurrent request per shard that runs there; only scalars come back.
"""

from __future__ import annotations

import itertools

import numpy as np

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

    def handle(self, name: str) -> PSVector:
        """The vector called `name`, live or brought back by a restore (after a rollback)."""
        v = self.live.get(name)
        if v is None:
            ctx = self.context
            spec = ctx.client.lookup(name)
            v = PSVector(spec, ctx.address, ctx.token, getattr(ctx, "tls_ca", None))
            self.live[name] = v
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

    def dots(self, pairs: list[tuple[PSVector, PSVector]]) -> list[float]:
        """All dot products in one request per shard; the partials are summed here."""
        if not pairs:
            return []
        models, index = [], {}
        for v in (v for pair in pairs for v in pair):
            if v.name not in index:
                index[v.name] = len(models)
                models.append(v.spec)
        ij = [(index[x.name], index[y.name]) for x, y in pairs]
        out = self.context.client.call("linalg.dots", models, {"pairs": ij})
        return [float(v) for v in np.sum([arrays[0] for _, arrays in out], axis=0)]

    def lincomb(self, out: PSVector, terms: list[tuple[float, PSVector]]) -> None:
        self.context.client.call(
            "linalg.lincomb",
            [out.spec, *[v.spec for _, v in terms]],
            {"coeffs": [float(c) for c, _ in terms]},
        )

    def lincombs_dots(
        self,
        combos: list[tuple[PSVector, list[tuple[float, PSVector]]]],
        pairs: list[tuple[PSVector, PSVector]],
    ) -> list[float]:
        """Linear combinations, then dot products, in one request per shard."""
        models, index = [], {}

        def at(v: PSVector) -> int:
            if v.name not in index:
                index[v.name] = len(models)
                models.append(v.spec)
            return index[v.name]

        spec = {
            "combos": [[at(o), [[float(c), at(v)] for c, v in t]] for o, t in combos],
            "pairs": [[at(x), at(y)] for x, y in pairs],
        }
        out = self.context.client.call("linalg.lincombs_dots", models, spec)
        return [float(v) for v in np.sum([arrays[0] for _, arrays in out], axis=0)]

    def release(self, x: PSVector) -> None:
        self.live.pop(x.name, None)
        x.drop()

    def release_all(self) -> None:
        """Drop every vector still alive (end of a fit, or after a failure)."""
        for v in list(self.live.values()):
            self.release(v)
