"""The vector algebra the L-BFGS / OWL-QN solver needs, behind one small interface.

The solver never touches vector elements: it holds opaque handles and asks a
:class:`VecSpace` to combine them, getting only scalars back. With
:class:`NumpyVecSpace` the handles are local numpy arrays; a PS backend keeps
them as co-located vectors on the shards and runs each op there, so L-BFGS
history of any dimension never travels to the driver.

All handles of one space have the same dimension. Element-wise work beyond
BLAS-1 goes through :meth:`VecSpace.apply` with a kernel named in
``ps_server.functions.vector.KERNELS``; a kernel returns one partial scalar per
slice and the space returns their sum.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

import numpy as np

from ps_server.functions.vector import KERNELS

__all__ = ["VecSpace", "NumpyVecSpace"]

V = TypeVar("V")


class VecSpace(Protocol[V]):
    """Dense vectors of one dimension, manipulated only through handles.

    Ops mirror BLAS-1 (``y += a*x`` is ``axpy(a, x, y)``); every reduction returns a
    Python float. Handles are created zeroed by :meth:`new` and must be given back
    with :meth:`release`.
    """

    dim: int

    def new(self, name: str) -> V:
        """A new zero vector; ``name`` is a label for debugging/PS model names."""
        ...

    def copy(self, dst: V, src: V) -> None:
        """``dst = src``."""
        ...

    def axpy(self, a: float, x: V, y: V) -> None:
        """``y += a * x``."""
        ...

    def scale(self, a: float, x: V) -> None:
        """``x *= a``."""
        ...

    def dot(self, x: V, y: V) -> float:
        """``x . y``."""
        ...

    def nrm2(self, x: V) -> float:
        """Euclidean norm of ``x``."""
        ...

    def sum(self, x: V) -> float:
        """Sum of the elements of ``x``."""
        ...

    def fill(self, x: V, value: float) -> None:
        """Set every element of ``x`` to ``value``."""
        ...

    def apply(self, kernel: str, out: V, *inputs: V, **scalars: float) -> float:
        """Run kernel ``kernel`` over co-located slices; return the sum of its partials."""
        ...

    def dots(self, pairs: list[tuple[V, V]]) -> list[float]:
        """Many dot products in one pass (one round trip on the PS)."""
        ...

    def lincomb(self, out: V, terms: list[tuple[float, V]]) -> None:
        """``out = sum(c * v for c, v in terms)``; ``out`` may appear in ``terms``."""
        ...

    def lincombs_dots(
        self, combos: list[tuple[V, list[tuple[float, V]]]], pairs: list[tuple[V, V]]
    ) -> list[float]:
        """Each ``lincomb(out, terms)`` of ``combos`` in order, then ``dots(pairs)``: one
        round trip on the PS."""
        ...

    def release(self, x: V) -> None:
        """Free ``x``; the handle must not be used afterwards."""
        ...


class NumpyVecSpace:
    """:class:`VecSpace` over local float64 numpy arrays (the handles are the arrays).

    Parameters
    ----------
    dim : int
        Dimension of every vector.
    shards : int, default 1
        Run reductions and kernels slice by slice over this many contiguous
        slices and sum the partials, exactly as PS shards would. Used by tests
        to check that results do not depend on the split.
    cols : int, default 1
        Each vector is a ``[dim, cols]`` matrix stored row by row (a multinomial model:
        a row per feature, a column per class); slices hold whole rows, as PS shards do.
        The BLAS-1 ops and kernels see the flat values; :meth:`col_dots` and
        :meth:`col_axpy` work per column.
    """

    def __init__(self, dim: int, shards: int = 1, cols: int = 1) -> None:
        if int(dim) != dim or dim < 1:
            raise ValueError(f"NumpyVecSpace: dim must be a positive integer, got {dim!r}")
        if int(shards) != shards or not 1 <= shards:
            raise ValueError(f"NumpyVecSpace: shards must be a positive integer, got {shards!r}")
        if int(cols) != cols or cols < 1:
            raise ValueError(f"NumpyVecSpace: cols must be a positive integer, got {cols!r}")
        self.dim, self.cols = int(dim), int(cols)
        rows = np.linspace(0, self.dim, min(int(shards), self.dim) + 1).astype(np.int64)
        bounds = rows * self.cols
        self._slices = [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
        self._live: dict[int, str] = {}
        self.peak_live = 0

    # ---------------------------------------------------------------- handles

    def new(self, name: str) -> np.ndarray:
        """A zero vector, registered as live."""
        x = np.zeros(self.dim * self.cols, dtype=np.float64)
        self._live[id(x)] = name
        self.peak_live = max(self.peak_live, len(self._live))
        return x

    def from_array(self, name: str, values: np.ndarray) -> np.ndarray:
        """A new vector holding a copy of ``values`` (local convenience, not in the protocol)."""
        x = self.new(name)
        x[...] = self._check_shape(np.asarray(values, dtype=np.float64), name)
        return x

    def to_numpy(self, x: np.ndarray) -> np.ndarray:
        """A copy of the vector's elements (local convenience, not in the protocol)."""
        return np.array(self._own(x), copy=True)

    def release(self, x: np.ndarray) -> None:
        """Forget ``x``."""
        if self._live.pop(id(x), None) is None:
            raise ValueError("NumpyVecSpace.release: handle is not a live vector of this space")

    @property
    def live(self) -> int:
        """Number of vectors currently allocated."""
        return len(self._live)

    # ---------------------------------------------------------------- BLAS-1

    def copy(self, dst: np.ndarray, src: np.ndarray) -> None:
        self._own(dst)[...] = self._own(src)

    def axpy(self, a: float, x: np.ndarray, y: np.ndarray) -> None:
        self._own(y)[...] += float(a) * self._own(x)

    def scale(self, a: float, x: np.ndarray) -> None:
        self._own(x)[...] *= float(a)

    def fill(self, x: np.ndarray, value: float) -> None:
        self._own(x)[...] = float(value)

    def dot(self, x: np.ndarray, y: np.ndarray) -> float:
        x, y = self._own(x), self._own(y)
        return float(sum(float(np.dot(x[s], y[s])) for s in self._slices))

    def nrm2(self, x: np.ndarray) -> float:
        x = self._own(x)
        return float(np.sqrt(sum(float(np.dot(x[s], x[s])) for s in self._slices)))

    def sum(self, x: np.ndarray) -> float:
        x = self._own(x)
        return float(sum(float(x[s].sum()) for s in self._slices))

    def apply(self, kernel: str, out: np.ndarray, *inputs: np.ndarray, **scalars: float) -> float:
        """Run ``KERNELS[kernel]`` on each slice of ``out`` and ``inputs``; sum the partials."""
        fn = KERNELS.get(kernel)
        if fn is None:
            raise ValueError(f"unknown kernel {kernel!r} (known: {', '.join(sorted(KERNELS))})")
        arrays = [self._own(out)] + [self._own(v) for v in inputs]
        total = 0.0
        for s in self._slices:
            total += float(fn(*(a[s] for a in arrays), **scalars))
        return total

    def dots(self, pairs: list[tuple[np.ndarray, np.ndarray]]) -> list[float]:
        return [self.dot(x, y) for x, y in pairs]

    def lincomb(self, out: np.ndarray, terms: list[tuple[float, np.ndarray]]) -> None:
        acc = float(terms[0][0]) * self._own(terms[0][1])
        for c, v in terms[1:]:
            acc += float(c) * self._own(v)
        self._own(out)[...] = acc

    def lincombs_dots(
        self,
        combos: list[tuple[np.ndarray, list[tuple[float, np.ndarray]]]],
        pairs: list[tuple[np.ndarray, np.ndarray]],
    ) -> list[float]:
        for out, terms in combos:
            self.lincomb(out, terms)
        return self.dots(pairs)

    # ---------------------------------------------------------------- per column

    def col_dots(
        self, pairs: list[tuple[np.ndarray, np.ndarray]], rows: list[tuple[np.ndarray, int]] = ()
    ) -> np.ndarray:
        """Per-column dots of each pair (``cols`` values a pair), then the values of each
        ``(vector, row)`` in ``rows``, concatenated."""
        k = self.cols
        out = []
        for x, y in pairs:
            x, y = self._own(x), self._own(y)
            out.append(sum(np.einsum("ij,ij->j", *(a[s].reshape(-1, k) for a in (x, y)))
                           for s in self._slices))  # fmt: skip
        out += [self._own(v).reshape(-1, k)[int(r)].copy() for v, r in rows]
        return np.concatenate(out) if out else np.zeros(0)

    def col_axpy(self, coeffs: np.ndarray, x: np.ndarray, y: np.ndarray) -> None:
        """``y[:, c] += coeffs[c] * x[:, c]`` for every column c."""
        k = self.cols
        self._own(y).reshape(-1, k)[...] += np.asarray(coeffs, dtype=np.float64) * self._own(
            x
        ).reshape(-1, k)

    # ---------------------------------------------------------------- checks

    def _check_shape(self, x: np.ndarray, where: str) -> np.ndarray:
        if x.shape != (self.dim * self.cols,):
            raise ValueError(f"{where}: vector of shape {x.shape}, this space has dim {self.dim}")
        return x

    def _own(self, x: np.ndarray) -> np.ndarray:
        if id(x) not in self._live:
            raise ValueError("NumpyVecSpace: handle is not a live vector of this space")
        return x
