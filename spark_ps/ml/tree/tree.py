"""TreeArrays: one fitted regression tree as parallel numpy arrays (the shared GBT contract).

Node 0 is the root and children always follow their parents, so a tree can be walked
level by level with whole-array numpy instead of per-row recursion. A continuous split sends
``x <= threshold`` to the left child, exactly as MLlib's ``ContinuousSplit`` does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["TreeArrays", "ensemble_debug_string", "java_double_str"]

_INT_FIELDS = ("feature", "left", "right")
_FLOAT_FIELDS = ("threshold", "value", "impurity", "gain", "count")


def java_double_str(x: float) -> str:
    """Format a float the way Scala/Java ``Double.toString`` does (as MLlib debug strings show).

    Java prints plain decimals for 1e-3 <= |x| < 1e7 and ``d.dddE±n`` otherwise, always with at
    least one fractional digit; the digits are the shortest that round-trip.
    """
    x = float(x)
    if np.isnan(x):
        return "NaN"
    if np.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    if x == 0.0:
        return "-0.0" if np.signbit(x) else "0.0"
    sign = "-" if x < 0 else ""
    mant, exp = np.format_float_scientific(abs(x), unique=True, trim="-").split("e")
    exp10 = int(exp)
    digits = mant.replace(".", "")
    if 1e-3 <= abs(x) < 1e7:
        if exp10 >= 0:
            whole = digits[: exp10 + 1].ljust(exp10 + 1, "0")
            frac = digits[exp10 + 1 :] or "0"
        else:
            whole, frac = "0", "0" * (-exp10 - 1) + digits
        return f"{sign}{whole}.{frac}"
    frac = digits[1:] or "0"
    return f"{sign}{digits[0]}.{frac}E{exp10}"


@dataclass
class TreeArrays:
    """A fitted regression tree (see the model-tree contract in the common brief).

    Parameters
    ----------
    feature : int32[n]
        Split feature, -1 at a leaf.
    threshold : float64[n]
        Continuous split threshold (``x <= threshold`` goes left); unused at a leaf.
    left, right : int32[n]
        Child node ids, -1 at a leaf.
    value : float64[n]
        Prediction at the node (weighted mean of its training targets).
    impurity : float64[n]
        Variance of the node's targets; -1 for a leaf whose every candidate split was invalid
        (MLlib's convention).
    gain : float64[n]
        Information gain of the split, -1 at a leaf.
    count : float64[n]
        Weighted instance count.
    raw_count : int64[n] or None
        Unweighted instance count (MLlib stores it for export); optional.
    """

    feature: np.ndarray
    threshold: np.ndarray
    left: np.ndarray
    right: np.ndarray
    value: np.ndarray
    impurity: np.ndarray
    gain: np.ndarray
    count: np.ndarray
    raw_count: np.ndarray | None = field(default=None)

    def __post_init__(self) -> None:
        for name in _INT_FIELDS:
            setattr(self, name, np.ascontiguousarray(getattr(self, name), dtype=np.int32))
        for name in _FLOAT_FIELDS:
            setattr(self, name, np.ascontiguousarray(getattr(self, name), dtype=np.float64))
        if self.raw_count is not None:
            self.raw_count = np.ascontiguousarray(self.raw_count, dtype=np.int64)
        n = self.feature.shape[0]
        for name in _INT_FIELDS + _FLOAT_FIELDS + ("raw_count",):
            arr = getattr(self, name)
            if arr is not None and arr.shape != (n,):
                raise ValueError(f"TreeArrays.{name} has shape {arr.shape}, expected ({n},)")
        if n == 0:
            raise ValueError("TreeArrays needs at least one node (the root)")
        internal = self.feature >= 0
        kids = np.concatenate([self.left[internal], self.right[internal]])
        ids = np.flatnonzero(internal)
        if kids.size and (
            kids.min() < 1
            or kids.max() >= n
            or np.any(self.left[internal] <= ids)
            or np.any(self.right[internal] <= ids)
        ):
            raise ValueError("TreeArrays children must be valid node ids that follow their parent")

    @property
    def num_nodes(self) -> int:
        """Number of nodes, leaves included (MLlib's ``numNodes``)."""
        return int(self.feature.shape[0])

    @property
    def depth(self) -> int:
        """Depth of the deepest leaf (0 for a single leaf), as MLlib's ``depth``."""
        level = np.zeros(self.num_nodes, dtype=np.int64)
        for i in np.flatnonzero(self.feature >= 0):  # parents precede children
            level[self.left[i]] = level[self.right[i]] = level[i] + 1
        return int(level.max())

    @property
    def num_leaves(self) -> int:
        """Number of leaves."""
        return int(np.count_nonzero(self.feature < 0))

    def predict_leaf(self, X: np.ndarray) -> np.ndarray:
        """Node id of the leaf each row of ``X`` reaches, moving all rows one level at a time."""
        X = _as_matrix(X, self)
        node = np.zeros(X.shape[0], dtype=np.int32)
        active = np.arange(X.shape[0])
        while active.size:
            cur = node[active]
            feat = self.feature[cur]
            inner = feat >= 0
            active, cur, feat = active[inner], cur[inner], feat[inner]
            if not active.size:
                break
            go_left = X[active, feat] <= self.threshold[cur]
            node[active] = np.where(go_left, self.left[cur], self.right[cur])
        return node

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Prediction (leaf value) for each row of ``X``."""
        return self.value[self.predict_leaf(X)]

    def leaf_index(self) -> np.ndarray:
        """MLlib's leaf numbering: leaves counted left to right (depth first), -1 for inner nodes.

        This is what MLlib's ``leafCol`` reports for a row, so ``leaf_index()[predict_leaf(X)]``
        reproduces that column for one tree.
        """
        out = np.full(self.num_nodes, -1, dtype=np.int32)
        stack, rank = [0], 0
        while stack:
            i = stack.pop()
            if self.feature[i] < 0:
                out[i] = rank
                rank += 1
            else:
                stack.extend((int(self.right[i]), int(self.left[i])))
        return out

    def to_debug_string(self, indent: int = 0) -> str:
        """The tree printed like MLlib's ``Node.subtreeToString(indent)``.

        MLlib's ``DecisionTreeModel.toDebugString`` is its header line plus this with ``indent=2``;
        a GBT model prints each tree with ``indent=4`` (see :func:`ensemble_debug_string`).
        """
        lines: list[str] = []
        stack: list[tuple[int, int, str | None]] = [(0, indent, None)]
        while stack:
            i, ind, text = stack.pop()
            if text is not None:  # an "Else" line queued before the right subtree
                lines.append(text)
                continue
            pad = " " * ind
            if self.feature[i] < 0:
                lines.append(f"{pad}Predict: {java_double_str(self.value[i])}")
                continue
            cond = f"feature {int(self.feature[i])}"
            thr = java_double_str(self.threshold[i])
            lines.append(f"{pad}If ({cond} <= {thr})")
            stack.append((int(self.right[i]), ind + 1, None))
            stack.append((-1, 0, f"{pad}Else ({cond} > {thr})"))
            stack.append((int(self.left[i]), ind + 1, None))
        return "".join(line + "\n" for line in lines)

    def to_dict(self) -> dict[str, Any]:
        """Plain lists (JSON-able) for save/load."""
        out: dict[str, Any] = {
            name: getattr(self, name).tolist() for name in _INT_FIELDS + _FLOAT_FIELDS
        }
        if self.raw_count is not None:
            out["raw_count"] = self.raw_count.tolist()
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TreeArrays:
        """Inverse of :meth:`to_dict` (also accepts numpy arrays as values)."""
        missing = [k for k in _INT_FIELDS + _FLOAT_FIELDS if k not in data]
        if missing:
            raise ValueError(f"TreeArrays.from_dict: missing fields {missing}")
        kw = {k: np.asarray(data[k]) for k in _INT_FIELDS + _FLOAT_FIELDS}
        raw = data.get("raw_count")
        return cls(**kw, raw_count=None if raw is None else np.asarray(raw))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TreeArrays):
            return NotImplemented
        names = _INT_FIELDS + _FLOAT_FIELDS
        same = all(np.array_equal(getattr(self, k), getattr(other, k)) for k in names)
        if self.raw_count is None or other.raw_count is None:
            return same and self.raw_count is None and other.raw_count is None
        return same and np.array_equal(self.raw_count, other.raw_count)

    __hash__ = None  # type: ignore[assignment]


def _as_matrix(X: np.ndarray, tree: TreeArrays) -> np.ndarray:
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2:
        raise ValueError(f"X must be a 2-D (rows, features) array, got shape {X.shape}")
    need = int(tree.feature.max()) + 1
    if X.shape[1] < need:
        raise ValueError(f"X has {X.shape[1]} features but the tree splits on feature {need - 1}")
    return X


def ensemble_debug_string(
    trees: Sequence[TreeArrays], weights: Sequence[float], header: str
) -> str:
    """An ensemble printed like MLlib's ``TreeEnsembleModel.toDebugString``.

    ``header`` is the model's ``toString`` (e.g. ``"GBTClassificationModel: uid = ..., ..."``).
    """
    parts = [header + "\n"]
    for i, (tree, w) in enumerate(zip(trees, weights, strict=True)):
        parts.append(f"  Tree {i} (weight {java_double_str(w)}):\n")
        parts.append(tree.to_debug_string(4))
    return "".join(parts)
