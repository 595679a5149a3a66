"""Runnable examples on real data: ``python -m spark_ps.examples.flights_lr`` (batch LR) and
``python -m spark_ps.examples.flights_online`` (streaming FTRL). The ``examples/`` folder of
the repository holds launchers of the same jobs for ``spark-submit``."""
