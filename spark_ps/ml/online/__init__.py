"""Online learning from Structured Streaming: FTRL-proximal LR whose model lives on the PS."""

from spark_ps.ml.online.learner import OBSERVATION, OnlineLogisticRegression
from spark_ps.ml.online.model import LiveLogisticRegressionModel

__all__ = ["OnlineLogisticRegression", "LiveLogisticRegressionModel", "OBSERVATION"]
