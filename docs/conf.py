"""Sphinx configuration of the spark-ps docs (built by ``scripts/docs.sh``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent / "_ext"))
# the doctests start Spark: its Python workers must import this checkout too
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
)
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("SPARK_PS_PROGRESS", "0")

project = "spark-ps"
author = "the spark-ps authors"
copyright = "the spark-ps authors, Apache-2.0"  # noqa: A001
release = "0.1.0"

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.doctest",
    "numpydoc",
    "myst_parser",
    "psconfig",
    "psparams",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build"]
html_theme = "furo"
html_title = "spark-ps"

# Signatures show names only; the types are in each docstring's Parameters section.
autodoc_typehints = "none"
autodoc_member_order = "bysource"
autodoc_default_options = {"members": True}
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False

# The user guide's examples start their own Spark and PS in testsetup blocks; the
# docstrings' examples (the API reference) run too, with the public names imported.
doctest_global_setup = """
from spark_ps.ml.classification import *  # noqa: F403
from spark_ps.ml.online import *  # noqa: F403
from spark_ps.ml.regression import *  # noqa: F403
"""

# Cross-references that have no target in these docs (-n makes any other an error):
# pyspark's own classes (the build uses no network, so no intersphinx), spark_ps's internal
# modules, and the bare Param names of pyspark-style docstrings ("Sets the value of
# :py:attr:`maxIter`"), which are Params, not documented attributes.
nitpick_ignore_regex = [
    ("py:class", r"pyspark\..+"),
    ("py:mod", r"spark_ps\..+"),
    ("py:attr", r"[A-Za-z]\w*"),
]
