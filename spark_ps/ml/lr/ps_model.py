"""A binomial LR model whose weights stay on the PS: scored without collecting the model.

``LogisticRegressionModel.toPS()`` (or :py:meth:`PSLogisticRegressionModel.fromPS` over an
existing sparse PS vector) gives a model whose ``transform`` reads the weights where they
live. How, is the ``scoringPath`` Param:

* ``local``: collect the weights once on the driver (``pull_all``) and score as an
  in-memory model (JVM broadcast, or Python workers).
* ``pull``: each Arrow batch deduplicates its keys and pulls only their weights (one pull
  per batch, one request per shard), then sums ``x . w`` on the worker.
* ``partial``: each batch sends every shard the entries of its rows whose keys that shard
  owns (its distinct keys, an int32 id per entry, the values, row boundaries); the shard
  answers one partial margin per row (``ps_server.functions.scoring``) and the worker adds
  them. Weights never leave the shards.
* ``auto`` (default): ``local`` when the model's non-zeros take at most ``maxCollectBytes``
  (16 bytes each: key and value), else per batch the path that moves fewer bytes, from the
  batch's key counts (:func:`choose_path`).

The rule of ``auto`` between ``pull`` and ``partial``, with ``U`` distinct keys, ``E``
entries and ``n`` rows in the batch and ``S`` shards: pull moves ``16 U`` bytes (keys out,
values back); partial moves ``8 U + 4 E + 8 E + 16 (n + 1) S`` (keys, ids, values, row
boundaries out and partial margins back), without the ``8 E`` of values when every value
is 1.0 (keys-only features). Partial wins only for keys-only rows whose distinct keys
exceed ``E / 2 + 2 n S``: batches whose rows share few keys.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
from pyspark.ml.param import Param, Params, TypeConverters

from ps_server.keys import dedup_by_shard
from spark_ps.data import CSRBatch
from spark_ps.ml.lr import model as lr_model
from spark_ps.ml.lr.model import LogisticRegressionModel
from spark_ps.ml.lr.scoring import row_sums
from spark_ps.models import PSVector

__all__ = ["PSLogisticRegressionModel", "PSScoring", "PATHS", "choose_path"]

_log = logging.getLogger(__name__)

#: Values of the ``scoringPath`` Param.
PATHS = ("auto", "local", "pull", "partial")


def choose_path(distinct_keys: int, entries: int, rows: int, shards: int, keys_only: bool) -> str:
    """ "pull" or "partial": whichever moves fewer bytes for one batch (module docstring)."""
    pull = 16 * distinct_keys
    partial = 8 * distinct_keys + 4 * entries + 16 * (rows + 1) * shards
    if not keys_only:
        partial += 8 * entries
    return "partial" if partial < pull else "pull"


class PSScoring:
    """Executor-side scoring state: the PS vector handle, the intercept and the path."""

    def __init__(self, weights: PSVector, intercept: float, path: str):
        self.weights, self.intercept, self.path = weights, float(intercept), path

    def margins(self, csr: CSRBatch) -> np.ndarray:
        """``x . w + b`` per row, the weights read from the PS by this state's path."""
        if csr.nnz == 0:
            return np.full(csr.n_rows, self.intercept)
        path = self.path
        if path != "partial":  # pull's keys; auto decides by their count
            keys, local = csr.localize()
        if path == "auto":
            ones = bool(np.all(csr.values == 1.0))
            path = choose_path(keys.size, csr.nnz, csr.n_rows, self.weights.spec.num_shards, ones)
        if path == "pull":
            w = self.weights.pull(keys)
            return row_sums(local.indptr, local.values * w[local.indices]) + self.intercept
        limit = PARTIAL_MAX_BYTES or _partial_limit(self.weights.client)
        out = [partial_margins(self.weights, part) for part in _row_chunks(csr, limit)]
        return (out[0] if len(out) == 1 else np.concatenate(out)) + self.intercept


#: Largest request of one ``scoring.margins`` call (None: `_partial_limit`); a batch
#: whose entries would exceed it is sent in row ranges (server function calls are not
#: chunked by the client).
PARTIAL_MAX_BYTES: int | None = None


def _partial_limit(client) -> int:
    """16 MB, or half the PS's request limit if lower (never below the client's chunk
    size): a default Arrow batch (10,000 rows of 30 keys, ~6 MB) in one call each, since
    every row range pays its own key deduplication."""
    limit = 16 << 20
    if client.max_request_bytes:
        limit = min(limit, client.max_request_bytes // 2)
    return max(limit, client.chunk_bytes)


def _row_chunks(csr: CSRBatch, limit: int):
    """Row ranges of ``csr`` whose partial-margin requests stay below ``limit`` bytes
    (20 bytes an entry at most, 16 a row); a row alone above it is its own range."""
    cost = np.cumsum(20 * np.diff(csr.indptr) + 16)
    if cost[-1] <= limit:
        yield csr
        return
    start = 0
    while start < csr.n_rows:
        base = cost[start - 1] if start else 0
        stop = max(int(np.searchsorted(cost, base + limit, side="right")), start + 1)
        lo, hi = int(csr.indptr[start]), int(csr.indptr[stop])
        yield CSRBatch(
            csr.indptr[start : stop + 1] - lo,
            csr.indices[lo:hi],
            csr.values[lo:hi],
            csr.num_features,
        )
        start = stop


def partial_margins(weights: PSVector, csr: CSRBatch) -> np.ndarray:
    """Sum over the shards of each row's partial margin (``scoring.margins`` on each).

    The batch's keys are deduplicated and grouped by shard in one pass (a hash table when
    compiled, :func:`ps_server.keys.dedup_by_shard`), and its entries grouped by shard
    with a stable sort on the shard number (a radix sort), so each shard's entries stay in
    row order."""
    spec = weights.spec
    n, nnz, num_shards = csr.n_rows, csr.nnz, spec.num_shards
    bounds = spec.bounds() if spec.kind == "dense" else None
    keys, offsets, inverse = dedup_by_shard(csr.indices, num_shards, bounds)
    if inverse is None:
        inverse = np.arange(nnz, dtype=np.int64)
    shard_of_key = np.repeat(np.arange(num_shards, dtype=np.int16), np.diff(offsets))
    owner = shard_of_key[inverse]
    ids = (inverse - offsets[owner]).astype(np.int32)
    row_of = np.repeat(np.arange(n, dtype=np.int64), np.diff(csr.indptr))
    counts = np.bincount(owner * np.int64(n) + row_of, minlength=num_shards * n)
    indptrs = np.zeros((num_shards, n + 1), dtype=np.int64)
    np.cumsum(counts.reshape(num_shards, n), axis=1, out=indptrs[:, 1:])
    order = np.argsort(owner, kind="stable")
    ones = bool(np.all(csr.values == 1.0))
    ids, values = ids[order], (np.zeros(0) if ones else csr.values[order])
    at = np.concatenate([[0], np.cumsum(indptrs[:, -1])])
    arrays = [
        [
            keys[offsets[s] : offsets[s + 1]],
            ids[at[s] : at[s + 1]],
            values if ones else values[at[s] : at[s + 1]],
            indptrs[s],
        ]
        for s in range(num_shards)
    ]
    # read-only (scoring.READ_ONLY): the shards' direct lanes, not a gRPC round trip
    answers = weights.client.call("scoring.margins", [spec], arrays=arrays, direct=True)
    total = np.zeros(n)
    for _, (partial,) in answers:
        total += partial
    return total


class _PSScoringParams(Params):
    scoringPath: Param[str] = Param(
        Params._dummy(),
        "scoringPath",
        "How transform reads weights that live on the PS: auto, local (collect once to the "
        "driver), pull (each batch pulls the weights of its keys) or partial (shards return "
        "partial margins per row).",
        typeConverter=TypeConverters.toString,
    )
    maxCollectBytes: Param[int] = Param(
        Params._dummy(),
        "maxCollectBytes",
        "With scoringPath=auto: the largest model (16 bytes per non-zero) collected to the "
        "driver and scored in memory; larger ones are scored from the PS.",
        typeConverter=TypeConverters.toInt,
    )

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._setDefault(scoringPath="auto", maxCollectBytes=64 << 20)


class PSLogisticRegressionModel(LogisticRegressionModel, _PSScoringParams):
    """A binomial ``LogisticRegressionModel`` whose coefficients live in a sparse PS vector.

    ``transform`` follows ``scoringPath`` (see :mod:`spark_ps.ml.lr.ps_model`). Coefficient
    attributes, ``toMLlib()`` and ``save`` collect the weights (counted in
    :py:attr:`collects`); ``save`` writes a plain ``LogisticRegressionModel``.
    """

    _weights: PSVector | None = None

    def __init__(self) -> None:
        super().__init__()
        self._weights = None
        self._nnz = 0
        self._arrays: tuple[np.ndarray, np.ndarray] | None = None
        self.collects = 0  # times the whole model was pulled to the driver

    @classmethod
    def fromPS(
        cls, weights: PSVector, intercept: float, numFeatures: int
    ) -> PSLogisticRegressionModel:
        """A model over an existing sparse PS vector of coefficients (one column)."""
        if weights.spec.kind != "sparse" or weights.spec.cols != 1:
            raise ValueError(
                f"fromPS: {weights.name!r} must be a sparse PS vector with one column, got "
                f"kind={weights.spec.kind}, cols={weights.spec.cols}"
            )
        model = cls()
        model._install(weights, intercept, int(numFeatures))
        counts = weights.client.call("keyspace.count", [weights.spec])
        model._nnz = int(sum(r["count"] for r, _ in counts))
        return model

    def _install(self, weights: PSVector, intercept: float, num_features: int) -> None:
        empty = np.zeros(0, np.int64)
        self._set_coefficients(np.zeros(0), intercept, keys=empty, num_features=num_features)
        self._weights, self._arrays = weights, None

    def setScoringPath(self, value: str) -> PSLogisticRegressionModel:
        """Sets the value of :py:attr:`scoringPath`."""
        if value not in PATHS:
            raise ValueError(f"{self.uid}: scoringPath must be one of {PATHS}, got {value!r}")
        return self._set(scoringPath=value)

    def setMaxCollectBytes(self, value: int) -> PSLogisticRegressionModel:
        """Sets the value of :py:attr:`maxCollectBytes`."""
        if value < 0:
            raise ValueError(f"{self.uid}: maxCollectBytes must be >= 0, got {value!r}")
        return self._set(maxCollectBytes=value)

    @property
    def weights(self) -> PSVector:
        """The PS vector holding the coefficients."""
        return self._weights

    @property
    def numNonZeros(self) -> int:
        """Keys the PS vector holds."""
        return self._nnz

    def _collected(self) -> tuple[np.ndarray, np.ndarray]:
        """(sorted keys, values) of every non-zero on the PS, pulled once (counted)."""
        if self._arrays is None:
            keys, values = self._weights.pull()
            values = np.asarray(values, dtype=np.float64).reshape(-1)
            keep = values != 0.0
            self.collects += 1
            _log.info("%s: collected %d weights from the PS", self.uid, int(keep.sum()))
            self._arrays = (np.asarray(keys, dtype=np.int64)[keep], values[keep])
        return self._arrays

    def toLocal(self) -> LogisticRegressionModel:
        """An in-memory ``LogisticRegressionModel`` of the collected weights, same uid and
        LR Params."""
        keys, values = self._collected()
        local = LogisticRegressionModel.fromCoefficients(
            values, self._intercept, keys=keys, numFeatures=self._num_features
        )
        local._resetUid(self.uid)
        for p in self.params:
            if local.hasParam(p.name) and self.isSet(p):
                local._set(**{p.name: self.getOrDefault(p)})
        return local

    @property
    def _values(self) -> np.ndarray:
        return self._plain_values if self._weights is None else self._collected()[1]

    @_values.setter
    def _values(self, values: np.ndarray) -> None:
        self._plain_values = values

    @property
    def _keys(self) -> np.ndarray | None:
        return self._plain_keys if self._weights is None else self._collected()[0]

    @_keys.setter
    def _keys(self, keys: np.ndarray | None) -> None:
        self._plain_keys = keys

    def _path(self) -> str:
        path = self.getOrDefault(self.scoringPath)
        if path not in PATHS:
            raise ValueError(f"{self.uid}: scoringPath must be one of {PATHS}, got {path!r}")
        if path == "auto":
            return "local" if 16 * self._nnz <= self.getOrDefault(self.maxCollectBytes) else path
        return path

    def _scoring_state(self) -> Any:
        """In-memory coefficients (path local; the JVM scores them when it can), else the
        handle executors read the PS through."""
        if self._path() == "local":
            return LogisticRegressionModel._scoring_state(self)
        return PSScoring(self._weights, self._intercept, self.getOrDefault(self.scoringPath))

    def compress(self, bits: int = 8, prune: float = 0.0, pruneFraction: float = 0.0):
        """A compressed in-memory model of the collected weights."""
        return self.toLocal().compress(bits, prune, pruneFraction)

    def write(self):
        """Writes the collected weights as a plain ``LogisticRegressionModel``."""
        return self.toLocal().write()

    def drop(self) -> None:
        """Drop the PS vector (the model cannot score afterwards)."""
        self._weights.drop()

    def __repr__(self) -> str:
        return (
            f"PSLogisticRegressionModel: uid={self.uid}, numFeatures={self.numFeatures}, "
            f"numNonZeros={self._nnz}, weights={self._weights.name if self._weights else None}"
        )


def to_ps(model: LogisticRegressionModel, context=None, name: str | None = None):
    """``model``'s non-zero coefficients pushed into a new sparse PS vector."""
    if model._multinomial:
        raise NotImplementedError(f"{model.uid}.toPS: only binomial models live on the PS")
    keys, values = model.coefficientKeys, model.coefficientValues
    keep = values != 0.0
    keys, values = keys[keep], values[keep]
    weights = PSVector.sparse(model.numFeatures, name=name, context=context)
    step = 1 << 20
    for i in range(0, keys.size, step):
        weights.update(keys[i : i + step], values[i : i + step])
    out = PSLogisticRegressionModel()
    out._install(weights, model._intercept, model.numFeatures)
    out._nnz = int(keys.size)
    out._resetUid(model.uid)
    model._copyValues(out)
    return out


lr_model._TO_PS = to_ps
