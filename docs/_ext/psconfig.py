"""Configuration reference generated from the code, so that it cannot drift.

``.. ps-config-keys::`` renders the ``spark.ps.*`` table of ``spark_ps.context``'s module
docstring (the list `PSContext` documents), and warns (an error under ``-W``) when a key the
package reads is missing from it or a default in ``spark_ps.context._DEFAULTS`` is not the
one the table states. ``.. ps-plugin-keys::`` renders its content (the keys only the JVM
bridge's plugin reads) and warns when a ``spark.ps.*`` key the plugin's Java reads is in
neither table. ``.. ps-env-vars::`` renders the README's table of ``SPARK_PS_*``
environment variables and warns when a variable the code reads is missing from it.
"""

from __future__ import annotations

import re
from pathlib import Path

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

ROOT = Path(__file__).resolve().parents[2]
log = logging.getLogger(__name__)

_KEY_IN_CODE = re.compile(r"spark\.ps\.([A-Za-z][\w.]*[A-Za-z])")
_CONF_CALL = re.compile(r"_conf\(\s*\w+,\s*\"([\w.]+)\"")
_ENV_IN_CODE = re.compile(r"\"(SPARK_PS_[A-Z0-9_]+)\"")


def _sources(*packages: str) -> list[Path]:
    return [
        p for pkg in packages for p in sorted((ROOT / pkg).rglob("*.py")) if "_pb2" not in p.name
    ]


def context_keys() -> list[tuple[str, str]]:
    """``(key, meaning)`` rows of the ``spark.ps.*`` table in `spark_ps.context`'s docstring."""
    import spark_ps.context as context

    rows: list[tuple[str, str]] = []
    for line in (context.__doc__ or "").splitlines():
        m = re.match(r"``spark\.ps\.([\w.]+)``\s+(.*)", line)
        if m:
            rows.append((m.group(1), m.group(2).strip()))
        elif rows and line.startswith("====="):
            break  # the table's closing rule
        elif rows and line.startswith(" ") and line.strip():
            key, text = rows[-1]  # a continuation line of the meaning column
            rows[-1] = (key, f"{text} {line.strip()}")
    return rows


def keys_read_by_code() -> set[str]:
    """Every ``spark.ps.*`` key the package names or reads through ``_conf``."""
    keys: set[str] = set()
    for path in _sources("spark_ps"):
        text = path.read_text()
        keys.update(_CONF_CALL.findall(text))
        keys.update(_KEY_IN_CODE.findall(text))
    return keys


def keys_read_by_plugin() -> set[str]:
    """Every ``spark.ps.*`` key the JVM bridge's Java sources name."""
    keys: set[str] = set()
    for path in sorted((ROOT / "jvm_bridge").rglob("*.java")):
        keys.update(_KEY_IN_CODE.findall(path.read_text()))
    return keys - _PLUGIN_INTERNAL_KEYS


def readme_env_rows() -> list[list[str]]:
    """The README's ``| variable | read by | what it does | default |`` table."""
    rows: list[list[str]] = []
    in_table = False
    for line in (ROOT / "README.md").read_text().splitlines():
        if line.startswith("| variable |"):
            in_table = True
            continue
        if in_table:
            if not line.startswith("|"):
                break
            if set(line.strip()) <= set("|-: "):
                continue
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
            rows.append(cells)
    return rows


def env_read_by_code() -> set[str]:
    """Every ``SPARK_PS_*`` variable the package and the server read (the examples' data
    folder aside)."""
    names: set[str] = set()
    for path in _sources("spark_ps", "ps_server"):
        if "examples" not in path.parts:
            names.update(_ENV_IN_CODE.findall(path.read_text()))
    return names


def env_in_readme_key_table() -> set[str]:
    """Variables the README's ``spark.ps.*`` table names as a key's alternative."""
    lines = (ROOT / "README.md").read_text().splitlines()
    text = "\n".join(line for line in lines if line.startswith("| `spark.ps."))
    return set(re.findall(r"SPARK_PS_[A-Z0-9_]+", text))


def _md_to_rst(text: str) -> str:
    return re.sub(r"(?<!`)`([^`]+)`(?!`)", r"``\1``", text)


def _list_table(header: list[str], rows: list[list[str]], widths: str) -> list[str]:
    out = [".. list-table::", "   :header-rows: 1", f"   :widths: {widths}", ""]
    for row in [header, *rows]:
        out.append(f"   * - {row[0]}")
        out.extend(f"     - {cell}" for cell in row[1:])
    return out


class _TableDirective(SphinxDirective):
    def _render(self, lines: list[str]) -> list[nodes.Node]:
        node = nodes.container()
        self.state.nested_parse(StringList(lines, source="psconfig"), self.content_offset, node)
        return node.children


class ConfigKeys(_TableDirective):
    def run(self):
        from spark_ps.context import _DEFAULTS

        rows = context_keys()
        listed = {key for key, _ in rows}
        where = self.get_location()
        for key in sorted(keys_read_by_code() - listed):
            log.warning(
                "spark.ps.%s is read by the code but not listed in spark_ps.context's "
                "docstring table",
                key,
                location=where,
            )
        for key, default in _DEFAULTS.items():
            text = dict(rows).get(key)
            if text is None:
                log.warning(
                    "spark.ps.%s has a default in _DEFAULTS but is not in the table",
                    key,
                    location=where,
                )
            elif default and key != "numShards" and f"default {default}" not in text:
                log.warning(
                    "spark.ps.%s: the table does not state the code's default %r",
                    key,
                    default,
                    location=where,
                )
        table = [[f"``spark.ps.{key}``", text] for key, text in rows]
        return self._render(_list_table(["key", "meaning"], table, "30 70"))


class PluginKeys(_TableDirective):
    has_content = True

    def run(self):
        listed = {key for key, _ in context_keys()}
        listed.update(_KEY_IN_CODE.findall("\n".join(self.content)))
        for key in sorted(keys_read_by_plugin() - listed):
            log.warning(
                "spark.ps.%s is read by the bridge plugin (jvm_bridge/) but is neither in "
                "spark_ps.context's table nor in this one",
                key,
                location=self.get_location(),
            )
        return self._render(list(self.content))


class EnvVars(_TableDirective):
    def run(self):
        rows = readme_env_rows()
        listed = {r[0].strip("`") for r in rows} | env_in_readme_key_table()
        for name in sorted(env_read_by_code() - listed - _INTERNAL_ENV):
            log.warning(
                "%s is read by the code but not in the README's table of environment variables",
                name,
                location=self.get_location(),
            )
        table = [[_md_to_rst(c) for c in row] for row in rows]
        return self._render(
            _list_table(["variable", "read by", "what it does", "default"], table, "22 14 50 14")
        )


# set by spark-ps itself for its own processes, not by users (the README says so)
_INTERNAL_ENV = {"SPARK_PS_TLS_CERT", "SPARK_PS_TLS_KEY", "SPARK_PS_TLS_CA"}
# set by the plugin for its executor half and for Python workers, not by users
_PLUGIN_INTERNAL_KEYS = {"executorId", "executors.python", "executors.shards"}


def setup(app):
    app.add_directive("ps-config-keys", ConfigKeys)
    app.add_directive("ps-plugin-keys", PluginKeys)
    app.add_directive("ps-env-vars", EnvVars)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
