"""Logistic regression math: MLlib's binary objective and a VecSpace L-BFGS / OWL-QN.

``objective`` holds the statistics, the data term and the reference local fit,
``optim`` the solver, ``vecspace`` the vector interface it is written against.
"""

__all__: list[str] = []
