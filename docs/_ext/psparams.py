"""``.. ps-params:: ours.Estimator theirs.Estimator``: a table of an estimator's Params.

Each row is read from a fresh instance of the spark-ps estimator (name, default, doc), and
says whether MLlib's estimator (the pyspark class, read without a JVM) has a Param of that
name, so the page shows what is MLlib's and what spark-ps adds.
"""

from __future__ import annotations

import importlib

from docutils import nodes
from docutils.statemachine import StringList
from pyspark.ml.param import Param
from sphinx.util.docutils import SphinxDirective


def _load(path: str):
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def param_rows(ours: str, theirs: str | None) -> list[tuple[str, str, str, bool]]:
    """``(name, default, doc, in_mllib)`` for every Param of ``ours``."""
    estimator = _load(ours)()
    mllib = set()
    if theirs:
        cls = _load(theirs)
        mllib = {n for n in dir(cls) if isinstance(getattr(cls, n, None), Param)}
    rows = []
    for p in estimator.params:
        default = repr(estimator.getOrDefault(p)) if estimator.hasDefault(p) else "unset"
        rows.append((p.name, default, " ".join(p.doc.split()), p.name in mllib))
    return rows


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("*", "\\*").replace("`", "\\`").replace("|", "\\|")


class ParamsTable(SphinxDirective):
    required_arguments = 1
    optional_arguments = 1

    def run(self):
        ours = self.arguments[0]
        theirs = self.arguments[1] if len(self.arguments) > 1 else None
        header = ["Param", "default", "in MLlib", "meaning"]
        widths = "18 14 8 60"
        if theirs is None:  # nothing to compare with: no MLlib column
            header, widths = ["Param", "default", "meaning"], "20 15 65"
        lines = [".. list-table::", "   :header-rows: 1", f"   :widths: {widths}", ""]
        for i, row in enumerate([header, *param_rows(ours, theirs)]):
            if i == 0:
                cells = row
            else:
                name, default, doc, in_mllib = row
                cells = [f"``{name}``", f"``{default}``", "yes" if in_mllib else "no", _escape(doc)]
                if theirs is None:
                    del cells[2]
            lines.append(f"   * - {cells[0]}")
            lines.extend(f"     - {c}" for c in cells[1:])
        node = nodes.container()
        self.state.nested_parse(StringList(lines, source=ours), self.content_offset, node)
        return node.children


def setup(app):
    app.add_directive("ps-params", ParamsTable)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
