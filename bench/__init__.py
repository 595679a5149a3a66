"""Benchmarks that run spark-ps beside MLlib (and LightGBM/XGBoost) and print ratios."""
