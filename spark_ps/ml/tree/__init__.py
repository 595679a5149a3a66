"""Histogram GBDT core: MLlib-compatible binning, exact histograms, losses and a local trainer.

Pure numpy functions; the distributed trainer composes the same pieces across Spark workers
and PS shards (split finding lives in :mod:`ps_server.functions.gbt`).
"""

from spark_ps.ml.tree.binning import (
    QuantileSketch,
    bin_csr,
    bin_matrix,
    merge_sketches,
    row_uniform,
    sketch_fraction,
    split_thresholds,
    summarize,
    summarize_csr,
)
from spark_ps.ml.tree.histogram import (
    FixedPointScale,
    build_histograms,
    choose_scale,
    derive_children,
    node_totals,
    quantize_rows,
    stats_to_moments,
)
from spark_ps.ml.tree.local import (
    TreeBuilder,
    evaluate_each_iteration,
    feature_importances,
    fit_gbt_local,
    predict_leaf,
    predict_margin,
    route_rows,
)
from spark_ps.ml.tree.loss import get_loss, margin_to_probability, margin_to_raw_prediction
from spark_ps.ml.tree.tree import TreeArrays, ensemble_debug_string

__all__ = [
    "FixedPointScale",
    "QuantileSketch",
    "TreeArrays",
    "TreeBuilder",
    "bin_csr",
    "bin_matrix",
    "build_histograms",
    "choose_scale",
    "derive_children",
    "ensemble_debug_string",
    "evaluate_each_iteration",
    "feature_importances",
    "fit_gbt_local",
    "get_loss",
    "margin_to_probability",
    "margin_to_raw_prediction",
    "merge_sketches",
    "node_totals",
    "predict_leaf",
    "predict_margin",
    "quantize_rows",
    "route_rows",
    "row_uniform",
    "sketch_fraction",
    "split_thresholds",
    "stats_to_moments",
    "summarize",
    "summarize_csr",
]
