"""Factorization machines on a PS embedding table: FMClassifier and FMRegressor.

The estimators and models are imported from ``spark_ps.ml.classification`` and
``spark_ps.ml.regression``; this package holds their parts (params, trainer, worker, model).
"""
