"""VecSpace over co-located dense PS vectors: the L-BFGS history lives on the shards.

Every op is one concurrent request per shard that runs there; only scalars come back.
"""

from __future__ import annotations

import itertools

import numpy as np

from spark_ps.models import PSMatrix, PSVector

__all__ = ["PSVecSpace"]


class PSVecSpace:
    """Dense PS vectors of one dimension (same dim => same shards: co-located).

    With ``cols`` > 1 every handle is a ``[dim, cols]`` PSMatrix (a row per feature, a
    column per class): shards hold whole rows, so one pull of a feature serves all its
    columns; the solver's ops see the flat values and :meth:`col_dots` / :meth:`col_axpy`
    work per column.
    """

    def __init__(self, context, dim: int, prefix: str, cols: int = 1):
        self.context, self.dim, self.prefix, self.cols = context, int(dim), prefix, int(cols)
        self._ids = itertools.count()
        self.live: dict[str, PSVector | PSMatrix] = {}

    def new(self, name: str) -> PSVector | PSMatrix:
        name = f"{self.prefix}/{name}/{next(self._ids)}"
        if self.cols == 1:
            v = PSVector.dense(self.dim, name=name, context=self.context)
        else:
            v = PSMatrix.dense(self.dim, self.cols, name=name, context=self.context)
        self.live[v.name] = v
        return v

    def handle(self, name: str) -> PSVector:
        """The vector called `name`, live or brought back by a restore (after a rollback)."""
        v = self.live.get(name)
        if v is None:
            ctx = self.context
            spec = ctx.client.lookup(name)
            cls = PSVector if spec.cols == 1 else PSMatrix
            v = cls(spec, ctx.address, ctx.token, getattr(ctx, "tls_ca", None))
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

    def col_dots(self, pairs: list, rows: list = ()) -> np.ndarray:
        """Per-column dots of each pair (``cols`` values a pair), then the values of each
        ``(matrix, row)`` of ``rows``: one request per shard."""
        models, index = [], {}

        def at(v) -> int:
            if v.name not in index:
                index[v.name] = len(models)
                models.append(v.spec)
            return index[v.name]

        spec = {
            "pairs": [[at(x), at(y)] for x, y in pairs],
            "rows": [[at(v), int(r)] for v, r in rows],
        }
        out = self.context.client.call("linalg.col_dots", models, spec)
        return np.sum([arrays[0] for _, arrays in out], axis=0)

    def col_axpy(self, coeffs: np.ndarray, x, y) -> None:
        """``y[:, c] += coeffs[c] * x[:, c]`` for every column c, on the shards."""
        coeffs = [float(c) for c in np.asarray(coeffs).reshape(-1)]
        self.context.client.call("linalg.col_axpy", [x.spec, y.spec], {"coeffs": coeffs})

    def spread(self, out, vector: PSVector) -> None:
        """Every column of ``out`` = ``vector`` (a PS vector of ``dim`` entries)."""
        self.context.client.call("linalg.spread", [out.spec, vector.spec], {})

    def release(self, x: PSVector) -> None:
        self.live.pop(x.name, None)
        x.drop()

    def release_all(self) -> None:
        """Drop every vector still alive (end of a fit, or after a failure)."""
        for v in list(self.live.values()):
            self.release(v)
