"""The live model of an online learner: scores with the weights on the PS right now."""

from __future__ import annotations

import numpy as np
from pyspark.ml.classification import (
    LogisticRegressionModel as MLlibLogisticRegressionModel,
)
from pyspark.ml.linalg import Vector

from spark_ps.data import CSRBatch
from spark_ps.ml.lr.model import LogisticRegressionModel
from spark_ps.ml.online.worker import FTRLConfig, margins, pull_weights, weights

__all__ = ["LiveLogisticRegressionModel", "snapshot_arrays"]


def snapshot_arrays(cfg: FTRLConfig) -> tuple[np.ndarray, np.ndarray, float]:
    """(sorted keys, non-zero weights, intercept) of every key the PS holds."""
    keys, zn = cfg.state.pull()
    zn = np.asarray(zn, dtype=np.float64).reshape(-1, 2)
    order = np.argsort(keys)
    keys, zn = np.asarray(keys, dtype=np.int64)[order], zn[order]
    is_b = keys == cfg.intercept_key
    b_state = zn[is_b]
    intercept = 0.0
    if cfg.fit_intercept and b_state.shape[0]:
        intercept = float(weights(cfg, b_state[:, 0], b_state[:, 1], True)[-1])
    keys, zn = keys[~is_b], zn[~is_b]
    w = weights(cfg, zn[:, 0], zn[:, 1], False)
    keep = w != 0.0
    return keys[keep], w[keep], intercept


class LiveLogisticRegressionModel(LogisticRegressionModel):
    """A ``LogisticRegressionModel`` whose weights are read from the PS at scoring time.

    ``transform`` pulls, per task, the FTRL state of the keys its rows touch and scores with
    the weights the stream has learned so far (MLlib's output columns). Coefficient
    attributes and :py:meth:`toMLlib` use a :py:meth:`snapshot` taken when called.
    """

    def __init__(self, cfg: FTRLConfig | None = None, recover=None) -> None:
        super().__init__()
        self._cfg = cfg
        self._recover = recover  # restores the model after a shard restart (the learner's)
        if cfg is not None:
            self._num_features = cfg.num_features

    def _scoring_state(self) -> FTRLConfig:
        if self._recover is not None:
            self._recover()
        return self._cfg

    @staticmethod
    def _margin(state: FTRLConfig, csr: CSRBatch) -> np.ndarray:
        if csr.n_rows == 0:
            return np.zeros(0)
        if csr.nnz and int(csr.indices.max()) >= state.num_features:
            raise ValueError(
                f"feature key {int(csr.indices.max())} outside the model's "
                f"numFeatures={state.num_features}"
            )
        keys, local = csr.localize()
        _, w = pull_weights(state, keys)
        return margins(state, local, w)

    @staticmethod
    def _margins(state: FTRLConfig, csr: CSRBatch) -> np.ndarray:
        m = LiveLogisticRegressionModel._margin(state, csr)
        return np.column_stack([-m, m])

    def snapshot(self) -> LogisticRegressionModel:
        """A plain (static) LogisticRegressionModel with the current weights."""
        if self._recover is not None:
            self._recover()
        keys, w, intercept = snapshot_arrays(self._cfg)
        model = LogisticRegressionModel.fromCoefficients(
            w, intercept, keys=keys, numFeatures=self._cfg.num_features
        )
        return self._copyValues(model)

    @property
    def coefficients(self) -> Vector:
        return self.snapshot().coefficients

    @property
    def intercept(self) -> float:
        return self.snapshot().intercept

    @property
    def coefficientKeys(self) -> np.ndarray:
        return self.snapshot().coefficientKeys

    @property
    def coefficientValues(self) -> np.ndarray:
        return self.snapshot().coefficientValues

    def compress(
        self, bits: int = 8, prune: float = 0.0, pruneFraction: float = 0.0
    ) -> LogisticRegressionModel:
        """A compressed static model of the current weights (see
        ``LogisticRegressionModel.compress``)."""
        return self.snapshot().compress(bits, prune, pruneFraction)

    def toMLlib(self) -> MLlibLogisticRegressionModel:
        """A genuine MLlib model of the current weights (see ``LogisticRegressionModel``)."""
        return self.snapshot().toMLlib()

    def __repr__(self) -> str:
        return f"LiveLogisticRegressionModel: uid={self.uid}, numFeatures={self.numFeatures}"
