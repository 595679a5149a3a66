"""Compressed coefficients of a binomial LR model: per-block int8/int16 codes, optional pruning.

:class:`QuantizedWeights` holds the stored weights in key order as integer ``codes`` (int8
for ``bits=8``, int16 for ``bits=16``) and one float64 ``scale`` per block of
:data:`BLOCK` stored weights (symmetric: ``scale = max |w| of the block / qmax`` with
qmax 127 or 32767; a stored weight reads back as ``code * scale``). Which feature ids are
stored is one of two layouts, whichever is smaller:

* dense: every feature id ``0..numFeatures-1`` has a code (pruned ones code 0); no keys.
* sparse: only the kept ids, sorted and gap-coded per block: the block's first key
  (``bases``, int64), the byte width of its gaps (``widths``: 1, 2, 4 or 8, the smallest
  that holds the block's largest gap) and the gaps themselves in one byte buffer, grouped by
  width. Hashed keys 2^24 wide with ~10^5..10^6 non-zeros have gaps of tens, so a key costs
  1-2 bytes instead of 8.

Error bound (why the test AUC barely moves). A stored weight is off by at most half a
step of its block, ``|w - code * scale| <= scale / 2``; a pruned weight is off by its own
magnitude, at most ``prunedMax`` (the largest ``|w|`` pruned). The margin of a row ``x``
is therefore off by at most ``sum_i |x_i| * e_i`` with ``e_i = scale_b(i) / 2`` for stored
ids and ``prunedMax`` for the others, i.e. at most ``||x||_1 * max(max scale / 2,
prunedMax)``. With 8 bits a block's step is 1/127 of its largest weight; typical rows
touch a few dozen features whose errors have random signs, so margins move by far less
than the gaps between the margins of differently labelled rows, and the order of the
scores (all that AUC reads) is almost unchanged. The intercept is kept exactly.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from spark_ps.data import CSRBatch
from spark_ps.ml.lr.scoring import row_sums

__all__ = ["BLOCK", "BITS", "QuantizedWeights", "QuantizedScoring"]

#: Stored weights per block: each block has its own scale (and gap width).
BLOCK = 256
#: Accepted code widths and the largest code of each (symmetric: -qmax..qmax).
BITS = {8: 127, 16: 32767}
_WIDTHS = (1, 2, 4, 8)


def check_compression(bits: Any, prune: Any, prune_fraction: Any, where: str) -> None:
    """ValueError naming the argument for bits not 8/16, prune < 0, fraction not in [0, 1)."""
    if isinstance(bits, bool) or bits not in BITS:
        raise ValueError(f"{where}: bits must be 8 or 16, got {bits!r}")
    if not isinstance(prune, (int, float)) or not (prune >= 0.0 and math.isfinite(prune)):
        raise ValueError(f"{where}: prune must be a finite threshold >= 0 on |w|, got {prune!r}")
    if not isinstance(prune_fraction, (int, float)) or not (0.0 <= prune_fraction < 1.0):
        raise ValueError(f"{where}: pruneFraction must be in [0, 1), got {prune_fraction!r}")


class QuantizedWeights:
    """Block-quantized weights (see the module docstring for the layout and error bound)."""

    def __init__(
        self,
        bits: int,
        codes: np.ndarray,
        scales: np.ndarray,
        num_features: int,
        pruned_max: float = 0.0,
        bases: np.ndarray | None = None,
        widths: np.ndarray | None = None,
        gaps: np.ndarray | None = None,
    ):
        self.bits, self.codes, self.scales = int(bits), codes, scales
        self.num_features, self.pruned_max = int(num_features), float(pruned_max)
        self.bases, self.widths, self.gaps = bases, widths, gaps

    @property
    def dense(self) -> bool:
        """Whether every feature id has a code (no keys stored)."""
        return self.bases is None

    @property
    def size(self) -> int:
        """Number of stored weights."""
        return int(self.codes.shape[0])

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays held (what the compressed model costs in memory)."""
        arrays = (self.codes, self.scales, self.bases, self.widths, self.gaps)
        return int(sum(a.nbytes for a in arrays if a is not None))

    # ------------------------------------------------------------------ encode

    @classmethod
    def quantize(
        cls,
        keys: np.ndarray | None,
        values: np.ndarray,
        num_features: int,
        bits: int,
        prune: float = 0.0,
        prune_fraction: float = 0.0,
    ) -> QuantizedWeights:
        """Quantize ``values`` (dense when ``keys`` is None, else at the sorted ``keys``).

        Drops exact zeros, weights with ``|w| < prune`` and the smallest ``prune_fraction``
        of the non-zero weights by magnitude.
        """
        check_compression(bits, prune, prune_fraction, "compress")
        values = np.asarray(values, dtype=np.float64)
        ids = np.arange(values.size, dtype=np.int64) if keys is None else keys
        mag = np.abs(values)
        keep = (mag >= prune) & (mag > 0.0)
        nonzero = np.flatnonzero(mag > 0.0)
        k = int(prune_fraction * nonzero.size)  # a fraction of the non-zero weights
        if k:
            keep[nonzero[np.argpartition(mag[nonzero], k - 1)[:k]]] = False
        dropped = mag[~keep]
        pruned_max = float(dropped.max()) if dropped.size else 0.0
        kept_ids, kept = ids[keep], values[keep]
        bases, widths, gaps = _encode_keys(kept_ids)
        sparse_bytes = _coded_bytes(kept.size, bits) + bases.nbytes + widths.nbytes + gaps.nbytes
        if keys is None and _coded_bytes(values.size, bits) <= sparse_bytes:
            codes, scales = _encode(np.where(keep, values, 0.0), bits)
            return cls(bits, codes, scales, num_features, pruned_max)
        codes, scales = _encode(kept, bits)
        return cls(bits, codes, scales, num_features, pruned_max, bases, widths, gaps)

    # ------------------------------------------------------------------ decode

    def keys(self) -> np.ndarray:
        """The stored feature ids, int64 sorted (``arange(numFeatures)`` when dense)."""
        if self.dense:
            return np.arange(self.num_features, dtype=np.int64)
        return _decode_keys(self.bases, self.widths, self.gaps, self.size)

    def values(self) -> np.ndarray:
        """The stored weights dequantized, float64, parallel to :py:meth:`keys`."""
        return self.values_at(np.arange(self.size))

    def values_at(self, positions: np.ndarray) -> np.ndarray:
        """Dequantized weights at stored positions: ``codes[p] * scales[p // BLOCK]``."""
        return self.codes[positions] * self.scales[positions // BLOCK]

    def half_steps(self) -> np.ndarray:
        """``scale / 2`` of each stored weight: its largest quantization error."""
        return np.repeat(self.scales / 2.0, BLOCK)[: self.size]

    # ------------------------------------------------------------------ save / load

    def to_arrays(self) -> tuple[dict, dict[str, np.ndarray]]:
        meta = {"bits": self.bits, "prunedMax": self.pruned_max, "block": BLOCK}
        arrays = {"codes": self.codes, "scales": self.scales}
        if not self.dense:
            arrays.update(bases=self.bases, widths=self.widths, gaps=self.gaps)
        return meta, arrays

    @classmethod
    def from_arrays(
        cls, meta: dict, arrays: dict[str, np.ndarray], num_features: int
    ) -> QuantizedWeights:
        bits = int(meta["bits"])
        if bits not in BITS or int(meta.get("block", BLOCK)) != BLOCK:
            raise ValueError(
                f"saved compressed model: bits={bits}, block={meta.get('block')} "
                f"(this version reads bits 8/16 with blocks of {BLOCK})"
            )
        codes = arrays["codes"].astype(np.int8 if bits == 8 else np.int16, copy=False)
        return cls(
            bits,
            codes,
            arrays["scales"],
            num_features,
            float(meta.get("prunedMax", 0.0)),
            arrays.get("bases"),
            arrays.get("widths"),
            arrays.get("gaps"),
        )


def _coded_bytes(n: int, bits: int) -> int:
    """Bytes of ``n`` codes and their block scales."""
    return n * bits // 8 + 8 * -(-n // BLOCK)


def _encode(values: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """(codes, per-block scales) of ``values``: symmetric, rounded to nearest."""
    qmax = BITS[bits]
    n = values.size
    nb = -(-n // BLOCK)
    padded = np.zeros(nb * BLOCK)
    padded[:n] = values
    peak = np.abs(padded.reshape(nb, BLOCK)).max(axis=1) if nb else np.zeros(0)
    scales = np.where(peak > 0.0, peak / qmax, 1.0)
    q = np.rint(padded.reshape(nb, BLOCK) / scales[:, None]).reshape(-1)[:n]
    codes = np.clip(q, -qmax, qmax).astype(np.int8 if bits == 8 else np.int16)
    return codes, scales


def _encode_keys(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sorted keys -> (block bases int64, gap widths uint8, gap bytes uint8)."""
    n = keys.size
    starts = np.arange(0, n, BLOCK)
    gaps = np.diff(keys, prepend=keys[:1]) if n else np.zeros(0, np.int64)
    gaps[starts] = 0
    peak = np.maximum.reduceat(gaps, starts) if n else np.zeros(0, np.int64)
    widths = np.select([peak < 2**8, peak < 2**16, peak < 2**32], [1, 2, 4], 8).astype(np.uint8)
    per_entry = np.repeat(widths, np.diff(np.append(starts, n)))
    parts = [gaps[per_entry == w].astype(f"<u{w}").view(np.uint8) for w in _WIDTHS]
    return keys[starts].copy(), widths, np.concatenate(parts) if parts else np.zeros(0, np.uint8)


def _decode_keys(bases: np.ndarray, widths: np.ndarray, buf: np.ndarray, n: int) -> np.ndarray:
    counts = np.diff(np.append(np.arange(0, n, BLOCK), n))
    per_entry = np.repeat(widths, counts)
    gaps = np.empty(n, dtype=np.int64)
    at = 0
    for w in _WIDTHS:
        mask = per_entry == w
        m = int(mask.sum())
        gaps[mask] = buf[at : at + m * w].view(f"<u{w}").astype(np.int64)
        at += m * w
    csum = np.cumsum(gaps)
    starts = np.arange(0, n, BLOCK)
    return np.repeat(bases - csum[starts], counts) + csum


class QuantizedScoring:
    """What executors score a compressed binomial model with: the codes stay codes.

    Each batch dequantizes only the weights its entries touch (a gather of codes times
    their block's scale). A sparse layout decodes its keys once per task (int64, 8 bytes a
    stored weight; never a dense float64 array over the key space).
    """

    def __init__(self, weights: QuantizedWeights, intercept: float):
        self.weights, self.intercept = weights, float(intercept)
        self._keys: np.ndarray | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_keys": None}  # decoded keys never travel

    def weights_at(self, indices: np.ndarray) -> np.ndarray:
        """Dequantized coefficient of each feature id (0 for ids not stored)."""
        q = self.weights
        if q.dense:
            return q.values_at(indices)
        if self._keys is None:
            self._keys = q.keys()
        if q.size == 0:
            return np.zeros(indices.shape[0])
        ids, inverse = np.unique(indices, return_inverse=True)  # sorted: cache-friendly
        pos = np.minimum(np.searchsorted(self._keys, ids), q.size - 1)
        return np.where(self._keys[pos] == ids, q.values_at(pos), 0.0)[inverse.reshape(-1)]

    def margins(self, csr: CSRBatch) -> np.ndarray:
        """``x . w + b`` per row with the dequantized weights."""
        return row_sums(csr.indptr, csr.values * self.weights_at(csr.indices)) + self.intercept
