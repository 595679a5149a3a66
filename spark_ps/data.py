"""Spark partitions (Arrow record batches) to numpy CSR mini-batches.

Workers read their partition once through ``df.mapInArrow`` and keep it as one
:class:`CSRBatch`; every estimator and PS worker computes on that contract.
Conversion is whole-array: Arrow list buffers are flattened zero-copy (offsets +
flat child values) and dense rows get their implicit indices from numpy index
arithmetic, so no Python code ever runs per row.

Supported features columns (``features_col``):

* ``VectorUDT``: arrives as ``struct<type: int8, size: int32, indices: list<int32>,
  values: list<double>>``; type 0 is sparse, type 1 dense (size and indices null).
  Sparse and dense rows may be mixed in one column.
* ``array<bigint>`` / ``array<int>``: keys (int64 feature ids, possibly beyond
  2**31), with values from ``values_col`` (``array<float|double>`` of equal
  lengths) or 1.0 each.
* ``array<float>`` / ``array<double>``: dense rows of equal length.
* ``binary`` / ``large_binary``: dense rows too, each a vector's values packed as
  little-endian float64 by the JVM bridge (``io.sparkps.bridge.PackedRows``): Spark's
  Arrow writer copies one byte array per row instead of every double.

Errors name the column and the row: ``row_offset + i``, the row's position in
its partition when batches come through :func:`read_partition`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

__all__ = [
    "CSRBatch",
    "DenseBatch",
    "DENSE_MAX_FEATURES",
    "arrow_to_csr",
    "read_partition",
    "iter_minibatches",
    "check_binary_labels",
    "features_kind",
    "VALIDATION_FLAG",
    "read_flags",
    "id_dtype",
]

_VECTOR_FIELDS = ("type", "size", "indices", "values")
VALIDATION_FLAG = "__spark_ps_validation"
"""The boolean column flagging validation rows in a fit job's input (validationIndicatorCol)."""
DENSE_MAX_FEATURES = 4096
"""Rows of at most this many features that store every column are computed on as a matrix."""
_SUPPORTED = (
    "VectorUDT (struct<type: int8, size: int32, indices: list<int32>, values: list<double>>), "
    "array<bigint>/array<int> keys, array<float>/array<double> dense, "
    "binary dense (float64 rows packed by the JVM bridge)"
)


# --------------------------------------------------------------------------- CSRBatch


def id_dtype(n: int) -> type:
    """The dtype of `n` compact ids: int32 while they fit (every real partition)."""
    return np.int32 if n <= np.iinfo(np.int32).max else np.int64


@dataclass
class CSRBatch:
    """Rows of a partition in CSR form; the one data contract of spark-ps.

    Attributes
    ----------
    indptr : int64 [n_rows + 1]
        Row ``i`` holds ``indices[indptr[i]:indptr[i+1]]``; ``indptr[0] == 0``.
    indices : int64 [nnz], or int32
        Global feature ids or keys (may exceed 2**31; duplicates within a row add up). A
        :meth:`localize` gives int32 ids (fewer than 2**31 keys): half the bytes,
        and scipy's CSR matrix takes them without a copy. Other input becomes int64.
    values : float64 [nnz]
        May be a read-only view of an Arrow buffer: copy before writing in place.
    num_features : int
        The dimension (vector size) or the key space; every index is below it.
    labels, weights : float64 [n_rows] or None
    """

    indptr: np.ndarray
    indices: np.ndarray
    values: np.ndarray
    num_features: int
    labels: np.ndarray | None = None
    weights: np.ndarray | None = None

    def __post_init__(self) -> None:
        # O(1) shape checks only: a batch is built once and read many times.
        self.indptr = np.asarray(self.indptr, dtype=np.int64)
        indices = np.asarray(self.indices)
        if indices.dtype != np.int32:  # int32: a localized batch's ids
            indices = indices.astype(np.int64, copy=False)
        self.indices = indices
        self.values = np.asarray(self.values, dtype=np.float64)
        self.num_features = int(self.num_features)
        if self.indptr.ndim != 1 or self.indptr.shape[0] < 1 or self.indptr[0] != 0:
            raise ValueError("CSRBatch.indptr must be 1-D, non-empty and start at 0")
        nnz = int(self.indptr[-1])
        if self.indices.shape != (nnz,) or self.values.shape != (nnz,):
            raise ValueError(
                f"CSRBatch: indptr[-1]={nnz} but indices has shape {self.indices.shape} "
                f"and values {self.values.shape}"
            )
        n = self.n_rows
        for name in ("labels", "weights"):
            arr = getattr(self, name)
            if arr is not None:
                arr = np.asarray(arr, dtype=np.float64)
                if arr.shape != (n,):
                    raise ValueError(f"CSRBatch.{name} has shape {arr.shape}, expected ({n},)")
                setattr(self, name, arr)

    @property
    def n_rows(self) -> int:
        """Number of rows."""
        return self.indptr.shape[0] - 1

    @property
    def nnz(self) -> int:
        """Number of stored entries."""
        return int(self.indptr[-1])

    @classmethod
    def empty(
        cls, num_features: int = 0, *, labels: bool = False, weights: bool = False
    ) -> CSRBatch:
        """A batch of 0 rows (an empty partition), with empty label/weight arrays if asked."""
        z = np.zeros(0, dtype=np.float64)
        return cls(
            np.zeros(1, dtype=np.int64),
            np.zeros(0, dtype=np.int64),
            z,
            num_features,
            z.copy() if labels else None,
            z.copy() if weights else None,
        )

    def slice(self, start: int, stop: int) -> CSRBatch:
        """Rows ``[start, stop)`` (stop clipped to ``n_rows``); arrays are views except indptr."""
        if start < 0 or stop < start:
            raise ValueError(f"CSRBatch.slice needs 0 <= start <= stop, got [{start}, {stop})")
        stop = min(stop, self.n_rows)
        start = min(start, stop)
        lo, hi = int(self.indptr[start]), int(self.indptr[stop])
        return CSRBatch(
            self.indptr[start : stop + 1] - lo,
            self.indices[lo:hi],
            self.values[lo:hi],
            self.num_features,
            None if self.labels is None else self.labels[start:stop],
            None if self.weights is None else self.weights[start:stop],
        )

    def take(self, rows: np.ndarray) -> CSRBatch:
        """Rows gathered in the given order (copies), by vectorized index arithmetic."""
        rows = np.asarray(rows, dtype=np.int64)
        if rows.ndim != 1:
            raise ValueError(f"CSRBatch.take needs 1-D row positions, got shape {rows.shape}")
        if rows.size and (rows.min() < 0 or rows.max() >= self.n_rows):
            raise ValueError(
                f"CSRBatch.take: row positions must be in [0, {self.n_rows}), "
                f"got range [{rows.min()}, {rows.max()}]"
            )
        starts = self.indptr[rows]
        lengths = self.indptr[rows + 1] - starts
        indptr = np.zeros(rows.shape[0] + 1, dtype=np.int64)
        np.cumsum(lengths, out=indptr[1:])
        pos = np.repeat(starts - indptr[:-1], lengths) + np.arange(indptr[-1], dtype=np.int64)
        return CSRBatch(
            indptr,
            self.indices[pos],
            self.values[pos],
            self.num_features,
            None if self.labels is None else self.labels[rows],
            None if self.weights is None else self.weights[rows],
        )

    def row_ids(self) -> np.ndarray:
        """int64 [nnz]: the row of each stored entry."""
        return np.repeat(np.arange(self.n_rows, dtype=np.int64), np.diff(self.indptr))

    def to_dense(self) -> np.ndarray:
        """float64 (n_rows, num_features); duplicate indices in a row are summed."""
        n, d = self.n_rows, self.num_features
        if self.indices.size == n * d and np.array_equal(  # rows that came in dense
            self.indices.reshape(n, d), np.broadcast_to(np.arange(d), (n, d))
        ):
            return np.array(self.values, dtype=np.float64).reshape(n, d)
        flat = self.row_ids() * d + self.indices
        out = np.bincount(flat, weights=self.values, minlength=n * d)
        return out.astype(np.float64, copy=False).reshape(n, d)

    def matvec(self, w: np.ndarray) -> np.ndarray:
        """``X @ w`` as float64 [n_rows]; ``w`` is dense, indexed by global feature id."""
        w = np.asarray(w)
        if w.ndim != 1 or w.shape[0] < self.num_features:
            raise ValueError(
                f"matvec: w has shape {w.shape}, needs 1-D of length >= "
                f"num_features={self.num_features}"
            )
        out = np.bincount(
            self.row_ids(), weights=self.values * w[self.indices], minlength=self.n_rows
        )
        return out.astype(np.float64, copy=False)

    def rmatvec(self, r: np.ndarray, dim: int) -> np.ndarray:
        """``X.T @ r`` as dense float64 [dim]; ``r`` holds one number per row."""
        r = np.asarray(r)
        if r.shape != (self.n_rows,):
            raise ValueError(f"rmatvec: r has shape {r.shape}, expected ({self.n_rows},)")
        if dim < self.num_features:
            raise ValueError(f"rmatvec: dim={dim} is below num_features={self.num_features}")
        out = np.bincount(self.indices, weights=self.values * r[self.row_ids()], minlength=dim)
        return out.astype(np.float64, copy=False)

    def localize(self) -> tuple[np.ndarray, CSRBatch]:
        """(sorted unique int64 keys, batch whose indices point into them: ids of `id_dtype`).

        Pull ``keys`` from the PS, compute on the small local dimension, push back.
        """
        if 0 < self.num_features <= 4 * self.nnz:
            # Small key space: a presence mask and a key -> id map replace the sort (the
            # map is written at the touched keys only, so untouched pages stay unallocated).
            seen = np.zeros(self.num_features, dtype=bool)
            seen[self.indices] = True
            keys = np.flatnonzero(seen)
            ids = np.empty(self.num_features, dtype=id_dtype(keys.size))
            ids[keys] = np.arange(keys.size, dtype=ids.dtype)
            inverse = ids[self.indices]
        else:
            keys, inverse = np.unique(self.indices, return_inverse=True)
            keys = keys.astype(np.int64, copy=False)  # int32 when re-localizing local ids
            inverse = inverse.astype(id_dtype(keys.size))
        local = CSRBatch(
            self.indptr,
            inverse.reshape(-1),
            self.values,
            keys.shape[0],
            self.labels,
            self.weights,
        )
        return keys, local

    @staticmethod
    def concat(batches: list[CSRBatch]) -> CSRBatch:
        """Rows of all batches in order; num_features is the largest of theirs."""
        if not batches:
            raise ValueError("CSRBatch.concat needs at least one batch")
        if len(batches) == 1:
            return batches[0]
        has_labels = {b.labels is not None for b in batches}
        has_weights = {b.weights is not None for b in batches}
        if len(has_labels) > 1 or len(has_weights) > 1:
            raise ValueError("CSRBatch.concat: batches disagree on having labels/weights")
        nnz = np.array([0] + [b.nnz for b in batches], dtype=np.int64)
        shifts = np.cumsum(nnz)[:-1]
        indptr = np.concatenate(
            [np.zeros(1, dtype=np.int64)]
            + [b.indptr[1:] + s for b, s in zip(batches, shifts, strict=True)]
        )
        return CSRBatch(
            indptr,
            np.concatenate([b.indices for b in batches]),
            np.concatenate([b.values for b in batches]),
            max(b.num_features for b in batches),
            np.concatenate([b.labels for b in batches]) if True in has_labels else None,
            np.concatenate([b.weights for b in batches]) if True in has_weights else None,
        )


@dataclass
class DenseBatch:
    """Rows that store every column: a C-contiguous ``[n_rows, num_features]`` float64 matrix.

    What :func:`read_partition` gives for ``array<float|double>`` features when asked
    (``dense_matrix=True``): no index array at all, so products are BLAS calls and
    statistics column reductions. It shares CSRBatch's ``n_rows``/``nnz``/``num_features``/
    ``labels``/``weights``/``localize`` contract where a trainer needs it.
    """

    matrix: np.ndarray
    labels: np.ndarray | None = None
    weights: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.matrix = np.ascontiguousarray(self.matrix, dtype=np.float64)
        if self.matrix.ndim != 2:
            raise ValueError(f"DenseBatch.matrix must be 2-D, got shape {self.matrix.shape}")
        for name in ("labels", "weights"):
            arr = getattr(self, name)
            if arr is not None and np.shape(arr) != (self.n_rows,):
                raise ValueError(f"DenseBatch.{name} has shape {np.shape(arr)}, expected rows")

    @property
    def n_rows(self) -> int:
        """Number of rows."""
        return self.matrix.shape[0]

    @property
    def num_features(self) -> int:
        """Number of columns."""
        return self.matrix.shape[1]

    @property
    def nnz(self) -> int:
        """Number of stored entries (every cell)."""
        return self.matrix.size

    def take(self, rows: np.ndarray) -> DenseBatch:
        """Rows gathered in the given order (copies)."""
        rows = np.asarray(rows, dtype=np.int64)
        opt = (None if a is None else a[rows] for a in (self.labels, self.weights))
        return DenseBatch(self.matrix[rows], *opt)

    def localize(self) -> tuple[np.ndarray, DenseBatch]:
        """(``arange(num_features)``, self): every column is touched, ids are the keys."""
        return np.arange(self.num_features, dtype=np.int64), self

    @staticmethod
    def concat(batches: list[DenseBatch]) -> DenseBatch:
        """Rows of all batches in order (one copy of the values)."""
        if len(batches) == 1:
            return batches[0]
        opt = [[getattr(b, n) for b in batches] for n in ("labels", "weights")]
        labels, weights = (None if a[0] is None else np.concatenate(a) for a in opt)
        return DenseBatch(np.concatenate([b.matrix for b in batches]), labels, weights)


def iter_minibatches(
    csr: CSRBatch, batch_size: int, *, shuffle: bool = False, seed: int = 0
) -> Iterator[CSRBatch]:
    """Consecutive mini-batches of ``batch_size`` rows (the last may be shorter).

    Without shuffle they are views (slices); with shuffle the rows follow one
    permutation drawn from ``seed`` (pass the epoch number for a fresh order per
    epoch) and each batch is gathered with vectorized indexing.
    """
    if int(batch_size) != batch_size or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    batch_size = int(batch_size)
    n = csr.n_rows
    order = np.random.default_rng(seed).permutation(n) if shuffle else None
    for start in range(0, n, batch_size):
        stop = min(start + batch_size, n)
        yield csr.slice(start, stop) if order is None else csr.take(order[start:stop])


# --------------------------------------------------------------------------- checks


def _where(column: str, row: int) -> str:
    return f"column {column!r} at row {row}"


def check_binary_labels(labels: np.ndarray, column: str, row_offset: int = 0) -> None:
    """Raise ValueError unless every label is 0.0 or 1.0 (binary classification).

    The message follows MLlib's ("Labels MUST be in {0, 1}, but got 2.0") and adds
    the column and the row (``row_offset + i``) of the first offending label.
    """
    labels = np.asarray(labels, dtype=np.float64)
    bad = (labels != 0.0) & (labels != 1.0)
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(
            f"Labels MUST be in {{0, 1}}, but got {float(labels[i])} "
            f"in {_where(column, row_offset + i)}"
        )


def _first(mask: np.ndarray) -> int:
    """Position of the first True in ``mask`` (which has one)."""
    return int(np.argmax(mask))


def _row_of(indptr: np.ndarray, pos: int) -> int:
    """Row holding flat position ``pos``."""
    return int(np.searchsorted(indptr, pos, side="right")) - 1


def _check_finite(values: np.ndarray, indptr: np.ndarray, what: str, row_offset: int) -> None:
    """Reject NaN/inf entries, naming the row of the first one."""
    finite = np.isfinite(values)
    if not finite.all():
        pos = _first(~finite)
        raise ValueError(
            f"{what}: value {float(values[pos])} at row {row_offset + _row_of(indptr, pos)} "
            "is not finite (NaN/inf features are not allowed)"
        )


def _check_no_nulls(arr: pa.Array, what: str, row_offset: int) -> None:
    """Reject null rows of ``arr`` naming the first one."""
    if arr.null_count:
        i = _first(arr.is_null().to_numpy(zero_copy_only=False))
        raise ValueError(f"{what}: null at row {row_offset + i}")


# --------------------------------------------------------------------------- Arrow helpers


def features_kind(dtype: pa.DataType, column: str = "features") -> str:
    """``"vector"``, ``"keys"`` or ``"dense"`` for a features column's Arrow type.

    Raises TypeError naming the type and the supported ones otherwise.
    """
    if pa.types.is_struct(dtype) and {dtype.field(i).name for i in range(dtype.num_fields)} == set(
        _VECTOR_FIELDS
    ):
        return "vector"
    if pa.types.is_list(dtype) or pa.types.is_large_list(dtype):
        inner = dtype.value_type
        if pa.types.is_signed_integer(inner):
            return "keys"
        if pa.types.is_float32(inner) or pa.types.is_float64(inner):
            return "dense"
    if _is_packed(dtype):
        return "dense"
    raise TypeError(
        f"features column {column!r} has unsupported Arrow type {dtype}; supported: {_SUPPORTED}"
    )


def _column(batch: pa.RecordBatch | pa.Table, name: str, role: str) -> pa.Array:
    if name not in batch.schema.names:
        raise ValueError(f"{role} column {name!r} not found; columns are {batch.schema.names}")
    col = batch.column(name)
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    return col


def _flat_list(arr: pa.Array) -> tuple[np.ndarray, pa.Array]:
    """(offsets rebased to 0 as int64 [n+1], flat child values of these rows), zero-copy.

    ``.offsets`` already honours a slice's offset; ``.values`` is the whole child,
    so it is cut to the rows' span (a view, no copy).
    """
    offs = arr.offsets.to_numpy(zero_copy_only=False)
    if offs.shape[0] == 0:  # empty arrays may come with no offsets buffer
        offs = np.zeros(len(arr) + 1, dtype=offs.dtype)
    base = int(offs[0])
    flat = arr.values.slice(base, int(offs[-1]) - base)
    return (offs - base).astype(np.int64, copy=False), flat


def _numeric(flat: pa.Array, dtype: type, what: str, indptr: np.ndarray, row_offset: int):
    """A flat numeric child as numpy ``dtype``: zero-copy when the type matches."""
    if flat.null_count:
        pos = _first(flat.is_null().to_numpy(zero_copy_only=False))
        raise ValueError(f"{what}: null element at row {row_offset + _row_of(indptr, pos)}")
    out = flat.to_numpy(zero_copy_only=False)
    return out.astype(dtype, copy=False)


# --------------------------------------------------------------------------- per kind


def _vector_to_csr(col: pa.StructArray, column: str, num_features: int | None, row_offset: int):
    """VectorUDT struct column -> (indptr, indices, values, num_features)."""
    what = f"features column {column!r}"
    _check_no_nulls(col, f"{what}: null vector", row_offset)
    types = col.field("type")
    _check_no_nulls(types, f"{what}: null vector type", row_offset)
    types = types.to_numpy(zero_copy_only=False)
    if ((types != 0) & (types != 1)).any():
        i = _first((types != 0) & (types != 1))
        raise ValueError(f"{what}: unknown vector type code {types[i]} at row {row_offset + i}")
    vlist = col.field("values")
    _check_no_nulls(vlist, f"{what}: null values array", row_offset)
    indptr, flat = _flat_list(vlist)
    values = _numeric(flat, np.float64, what, indptr, row_offset)
    lengths = np.diff(indptr)
    is_sparse = types == 0
    sizes = lengths
    if is_sparse.any():
        size_arr = col.field("size")
        if size_arr.null_count:
            bad = size_arr.is_null().to_numpy(zero_copy_only=False) & is_sparse
            if bad.any():
                raise ValueError(
                    f"{what}: sparse vector with null size at row {row_offset + _first(bad)}"
                )
            size_arr = size_arr.fill_null(-1)
        sizes = np.where(is_sparse, size_arr.to_numpy(zero_copy_only=False), lengths)
    num_features = _check_sizes(sizes, num_features, what, row_offset)
    if is_sparse.all():
        indices = _sparse_indices(col, is_sparse, lengths, what, row_offset)
    elif not is_sparse.any():
        indices = np.tile(np.arange(num_features, dtype=np.int64), types.shape[0])
    else:
        # Mixed: dense entries take their position within the row, sparse ones their index.
        indices = np.arange(values.shape[0], dtype=np.int64) - np.repeat(indptr[:-1], lengths)
        mask = np.repeat(is_sparse, lengths)
        indices[mask] = _sparse_indices(col, is_sparse, lengths, what, row_offset)
    bad = (indices < 0) | (indices >= num_features)
    if bad.any():
        pos = _first(bad)
        raise ValueError(
            f"{what}: index {indices[pos]} out of range [0, {num_features}) "
            f"at row {row_offset + _row_of(indptr, pos)}"
        )
    _check_finite(values, indptr, what, row_offset)
    return indptr, indices, values, num_features


def _check_sizes(sizes: np.ndarray, num_features: int | None, what: str, row_offset: int) -> int:
    """All vector sizes must equal num_features (or the first row's size when None)."""
    if num_features is None:
        if sizes.shape[0] == 0:
            return 0
        num_features, ref = int(sizes[0]), f"the first row's size {int(sizes[0])}"
    else:
        ref = f"num_features={num_features}"
    if sizes.shape[0] and (sizes != num_features).any():
        i = _first(sizes != num_features)
        raise ValueError(
            f"{what}: vector size {sizes[i]} at row {row_offset + i} differs from {ref}"
        )
    return num_features


def _sparse_indices(
    col: pa.StructArray, is_sparse: np.ndarray, lengths: np.ndarray, what: str, row_offset: int
) -> np.ndarray:
    """The indices of the sparse rows, concatenated, as int64; checked against value counts."""
    ilist = col.field("indices")
    if ilist.null_count:
        bad = ilist.is_null().to_numpy(zero_copy_only=False) & is_sparse
        if bad.any():
            raise ValueError(
                f"{what}: sparse vector with null indices at row {row_offset + _first(bad)}"
            )
    ioffs, iflat = _flat_list(ilist)
    ilen = np.diff(ioffs)
    bad = is_sparse & (ilen != lengths)
    if bad.any():
        i = _first(bad)
        raise ValueError(
            f"{what}: sparse vector at row {row_offset + i} has {ilen[i]} indices "
            f"but {lengths[i]} values"
        )
    idx = _numeric(iflat, np.int64, what, ioffs, row_offset)
    if not is_sparse.all() and ilen[~is_sparse].any():
        idx = idx[np.repeat(is_sparse, ilen)]  # dense rows backed by stray indices: drop them
    return idx


def _keys_to_csr(
    col: pa.Array,
    values_col: pa.Array | None,
    column: str,
    values_name: str | None,
    num_features: int | None,
    row_offset: int,
):
    """array<int|bigint> keys (+ optional values column) -> (indptr, indices, values, dim)."""
    what = f"features column {column!r}"
    _check_no_nulls(col, f"{what}: null keys array", row_offset)
    indptr, flat = _flat_list(col)
    keys = _numeric(flat, np.int64, what, indptr, row_offset)
    if keys.size:
        if keys.min() < 0:
            pos = _first(keys < 0)
            raise ValueError(
                f"{what}: negative key {keys[pos]} at row {row_offset + _row_of(indptr, pos)}"
            )
        if num_features is not None and keys.max() >= num_features:
            pos = _first(keys >= num_features)
            raise ValueError(
                f"{what}: key {keys[pos]} at row {row_offset + _row_of(indptr, pos)} "
                f"outside [0, num_features={num_features})"
            )
    if num_features is None:
        num_features = int(keys.max()) + 1 if keys.size else 0
    if values_col is None:
        return indptr, keys, np.ones(keys.shape[0], dtype=np.float64), num_features
    vwhat = f"values column {values_name!r}"
    _check_no_nulls(values_col, f"{vwhat}: null values array", row_offset)
    voffs, vflat = _flat_list(values_col)
    if voffs.shape != indptr.shape or (voffs != indptr).any():
        i = _first(np.diff(voffs) != np.diff(indptr))
        raise ValueError(
            f"row {row_offset + i}: {int(indptr[i + 1] - indptr[i])} keys in {column!r} but "
            f"{int(voffs[i + 1] - voffs[i])} values in {values_name!r}"
        )
    values = _numeric(vflat, np.float64, vwhat, indptr, row_offset)
    _check_finite(values, indptr, vwhat, row_offset)
    return indptr, keys, values, num_features


def _dense_values(col: pa.Array, column: str, num_features: int | None, row_offset: int):
    """array<float|double> rows of equal length -> (flat values, dim), validated."""
    what = f"features column {column!r}"
    _check_no_nulls(col, f"{what}: null array", row_offset)
    indptr, flat = _flat_list(col)
    num_features = _check_sizes(np.diff(indptr), num_features, what, row_offset)
    values = _numeric(flat, np.float64, what, indptr, row_offset)
    _check_finite(values, indptr, what, row_offset)
    return values, num_features


def _dense_to_csr(col: pa.Array, column: str, num_features: int | None, row_offset: int):
    """array<float|double> or packed rows of equal length -> (indptr, indices, values, dim)."""
    read = _packed_values if _is_packed(col.type) else _dense_values
    values, num_features = read(col, column, num_features, row_offset)
    n = len(col)
    indices = np.tile(np.arange(num_features, dtype=np.int64), n)
    return np.arange(n + 1, dtype=np.int64) * num_features, indices, values, num_features


def _is_numeric(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)


def _label_array(arr: pa.Array, column: str, row_offset: int) -> np.ndarray:
    """A numeric label column as float64, rejecting null/NaN/inf like MLlib."""
    if not (_is_numeric(arr.type) or pa.types.is_boolean(arr.type)):
        raise TypeError(f"label column {column!r} must be numeric, got Arrow type {arr.type}")
    if arr.null_count:
        i = _first(arr.is_null().to_numpy(zero_copy_only=False))
        raise ValueError(
            f"Labels MUST NOT be Null or NaN, got null in {_where(column, row_offset + i)}"
        )
    out = arr.cast(pa.float64()).to_numpy(zero_copy_only=False)
    if not np.isfinite(out).all():
        i = _first(~np.isfinite(out))
        kind = "Null or NaN" if np.isnan(out[i]) else "Infinity"
        raise ValueError(
            f"Labels MUST NOT be {kind}, got {float(out[i])} in {_where(column, row_offset + i)}"
        )
    return out


def _weight_array(arr: pa.Array, column: str, row_offset: int) -> np.ndarray:
    """A numeric weight column as float64: non-null, finite, non-negative."""
    if not _is_numeric(arr.type):
        raise TypeError(f"weight column {column!r} must be numeric, got Arrow type {arr.type}")
    if arr.null_count:
        i = _first(arr.is_null().to_numpy(zero_copy_only=False))
        raise ValueError(f"weights must not be null, got null in {_where(column, row_offset + i)}")
    out = arr.cast(pa.float64()).to_numpy(zero_copy_only=False)
    bad = ~np.isfinite(out)
    if bad.any():
        i = _first(bad)
        raise ValueError(
            f"weights must be finite, got {float(out[i])} in {_where(column, row_offset + i)}"
        )
    if (out < 0).any():
        i = _first(out < 0)
        raise ValueError(
            f"weights must be non-negative, got {float(out[i])} at row {row_offset + i} "
            f"(column {column!r})"
        )
    return out


# --------------------------------------------------------------------------- public entry points


def arrow_to_csr(
    batch: pa.RecordBatch | pa.Table,
    features_col: str,
    *,
    label_col: str | None = None,
    weight_col: str | None = None,
    values_col: str | None = None,
    num_features: int | None = None,
    row_offset: int = 0,
) -> CSRBatch:
    """One Arrow record batch -> a validated :class:`CSRBatch`.

    Parameters
    ----------
    batch : the record batch (a Table is accepted and its chunks combined).
    features_col : VectorUDT, ``array<int|bigint>`` keys or ``array<float|double>`` column.
    label_col, weight_col : optional numeric columns, returned as float64.
    values_col : ``array<float|double>`` values of a keys column (default 1.0 each).
    num_features : expected dimension; None takes the first row's size (vectors, dense
        arrays) or ``max key + 1`` (keys).
    row_offset : added to row positions in error messages (row number in the partition).
    """
    if num_features is not None and (int(num_features) != num_features or num_features < 0):
        raise ValueError(f"num_features must be a non-negative integer, got {num_features!r}")
    col = _column(batch, features_col, "features")
    kind = features_kind(col.type, features_col)
    if values_col is not None and kind != "keys":
        raise ValueError(
            f"values_col={values_col!r} needs an array<int>/array<bigint> keys features column, "
            f"but {features_col!r} has type {col.type}"
        )
    if kind == "vector":
        parts = _vector_to_csr(col, features_col, num_features, row_offset)
    elif kind == "dense":
        parts = _dense_to_csr(col, features_col, num_features, row_offset)
    else:
        vcol = None if values_col is None else _column(batch, values_col, "values")
        if vcol is not None and (
            _is_packed(vcol.type) or features_kind(vcol.type, values_col) != "dense"
        ):
            raise TypeError(
                f"values column {values_col!r} must be array<float|double>, got {vcol.type}"
            )
        parts = _keys_to_csr(col, vcol, features_col, values_col, num_features, row_offset)
    labels, weights = _labels_weights(batch, label_col, weight_col, row_offset)
    return CSRBatch(*parts, labels=labels, weights=weights)


def _labels_weights(batch, label_col: str | None, weight_col: str | None, row_offset: int):
    """(labels, weights) of a batch as validated float64 arrays, None where not asked."""
    labels = weights = None
    if label_col is not None:
        labels = _label_array(_column(batch, label_col, "label"), label_col, row_offset)
    if weight_col is not None:
        weights = _weight_array(_column(batch, weight_col, "weight"), weight_col, row_offset)
    return labels, weights


def _arrow_to_dense(batch, features_col: str, label_col, weight_col, num_features, row_offset):
    """One batch of ``array<float|double>`` or packed features -> a validated DenseBatch."""
    col = _column(batch, features_col, "features")
    read = _packed_values if _is_packed(col.type) else _dense_values
    values, d = read(col, features_col, num_features, row_offset)
    labels, weights = _labels_weights(batch, label_col, weight_col, row_offset)
    return DenseBatch(values.reshape(len(col), d), labels, weights)


def read_partition(
    batches: Iterable[pa.RecordBatch],
    features_col: str,
    *,
    label_col: str | None = None,
    weight_col: str | None = None,
    values_col: str | None = None,
    num_features: int | None = None,
    row_offset: int = 0,
    dense_matrix: bool = False,
) -> CSRBatch | DenseBatch:
    """A whole Spark partition (the iterator ``mapInArrow`` hands over) as one CSRBatch.

    Keywords are those of :func:`arrow_to_csr`; ``row_offset`` numbers the first
    row, so errors name rows counted from the start of the partition. For vector
    and dense columns the first non-empty batch's dimension binds the later ones
    (keys columns take the largest key space seen). An empty partition gives a
    batch of 0 rows with ``num_features`` (or 0) and empty label/weight arrays.
    With ``dense_matrix`` an ``array<float|double>`` or packed ``binary`` features column
    gives a :class:`DenseBatch` instead (no index arrays are built).
    """
    if dense_matrix and values_col is None:
        return _read_dense(batches, features_col, label_col, weight_col, num_features, row_offset)
    cols = {"label_col": label_col, "weight_col": weight_col, "values_col": values_col}
    parts: list[CSRBatch] = []
    for batch in batches:
        csr = arrow_to_csr(
            batch, features_col, num_features=num_features, row_offset=row_offset, **cols
        )
        row_offset += batch.num_rows
        if csr.n_rows == 0:
            continue
        if num_features is None:
            if features_kind(batch.schema.field(features_col).type, features_col) != "keys":
                num_features = csr.num_features
        parts.append(csr)
    if not parts:
        return CSRBatch.empty(
            num_features or 0, labels=label_col is not None, weights=weight_col is not None
        )
    return CSRBatch.concat(parts)


def read_flags(batches: list[pa.RecordBatch], column: str) -> np.ndarray:
    """bool [rows]: a non-null boolean column of a partition's record batches, in order
    (the rows :func:`read_partition` reads from the same batches)."""
    parts = [
        b.column(b.schema.get_field_index(column)).to_numpy(zero_copy_only=False) for b in batches
    ]
    return np.concatenate(parts).astype(bool) if parts else np.zeros(0, bool)


def _is_packed(dtype: pa.DataType) -> bool:
    return pa.types.is_binary(dtype) or pa.types.is_large_binary(dtype)


def _packed_values(col: pa.Array, column: str, num_features: int | None, row_offset: int):
    """``binary`` rows of little-endian float64 (``io.sparkps.bridge.PackedRows``) -> (flat
    values, dim): one view of the Arrow data buffer, checked as :func:`_dense_values`."""
    what = f"features column {column!r}"
    _check_no_nulls(col, f"{what}: null array", row_offset)
    n_rows = len(col)
    _, offs_buf, data = col.buffers()
    if n_rows == 0 or offs_buf is None:  # empty arrays may come with no buffers
        return np.zeros(0), num_features or 0
    width = np.dtype(np.int64 if pa.types.is_large_binary(col.type) else np.int32)
    offs = np.frombuffer(offs_buf, width, count=n_rows + 1, offset=col.offset * width.itemsize)
    lengths = np.diff(offs)
    if (lengths % 8).any():
        i = _first(lengths % 8 != 0)
        raise ValueError(
            f"{what}: packed row of {lengths[i]} bytes at row {row_offset + i} is not a whole "
            "number of float64 values"
        )
    num_features = _check_sizes(lengths // 8, num_features, what, row_offset)
    n = n_rows * num_features
    values = np.frombuffer(data, dtype="<f8", count=n, offset=int(offs[0])) if n else np.zeros(0)
    _check_finite(values, np.arange(n_rows + 1) * num_features, what, row_offset)
    return values.astype(np.float64, copy=False), num_features


def _read_dense(batches, features_col, label_col, weight_col, num_features, row_offset):
    """:func:`read_partition` for ``array<float|double>`` or packed features: one DenseBatch."""
    parts: list = []
    for batch in batches:
        col = _column(batch, features_col, "features")
        if features_kind(col.type, features_col) != "dense":
            raise TypeError(
                f"dense_matrix=True needs an array<float|double> or packed binary features "
                f"column; {features_col!r} has type {col.type}"
            )
        part = _arrow_to_dense(batch, features_col, label_col, weight_col, num_features, row_offset)
        row_offset += batch.num_rows
        if part.n_rows:
            num_features = part.num_features
            parts.append(part)
    if not parts:
        z = np.zeros(0)
        return DenseBatch(
            np.zeros((0, num_features or 0)),
            z.copy() if label_col is not None else None,
            z.copy() if weight_col is not None else None,
        )
    return DenseBatch.concat(parts)
