"""The docs stay true: every test a doc page names as the proof of a claim exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_test_the_protocol_page_cites_exists():
    text = (ROOT / "docs" / "replication.md").read_text()
    cited = re.findall(r"`(test_\w+\.py)::(test_\w+)`", text)
    assert len(cited) >= 6
    for module, name in cited:
        source = (ROOT / "tests" / module).read_text()
        assert re.search(rf"^def {name}\(", source, re.M), f"{module}::{name} is cited, not there"


_PROMISES = re.compile(
    r"no update lost|exactly[ -]once|never applied again|never promoted|never acknowledg"
    r"|fail their call",
    re.I,
)


def test_every_promise_in_a_docstring_is_listed_with_its_tests():
    """A module that promises delivery (the phrases above) is in docs/promises.md, whose
    every cited test exists: a new promise without a test fails here."""
    page = (ROOT / "docs" / "promises.md").read_text()
    cited = re.findall(r"`(test_\w+\.py)::(test_\w+)`", page)
    assert len(cited) >= 20
    for module, name in cited:
        source = (ROOT / "tests" / module).read_text()
        assert re.search(rf"^def {name}\(", source, re.M), f"{module}::{name} is cited, not there"
    listed = set(re.findall(r"`((?:ps_server|spark_ps)/[\w/]+\.py)`", page))
    promising = {
        str(path.relative_to(ROOT))
        for package in ("ps_server", "spark_ps")
        for path in (ROOT / package).rglob("*.py")
        if _PROMISES.search(path.read_text())
    }
    assert promising <= listed, f"promises with no test listed: {sorted(promising - listed)}"


def _psconfig():
    import sys

    sys.path.insert(0, str(ROOT / "docs" / "_ext"))
    try:
        import psconfig
    finally:
        sys.path.remove(str(ROOT / "docs" / "_ext"))
    return psconfig


def test_the_configuration_page_lists_every_key_the_code_reads():
    from spark_ps.context import _DEFAULTS

    psconfig = _psconfig()
    listed = dict(psconfig.context_keys())
    read = psconfig.keys_read_by_code()
    assert {"address", "token", "numShards", "checkpointDir", "tls.ca"} <= read
    assert read <= set(listed), f"not on the page: {sorted(read - set(listed))}"
    assert set(_DEFAULTS) <= set(listed)
    assert "default 120" in listed["rpcTimeout"] and _DEFAULTS["rpcTimeout"] == "120"


def test_the_configuration_page_lists_every_environment_variable_the_code_reads():
    psconfig = _psconfig()
    listed = {row[0].strip("`") for row in psconfig.readme_env_rows()}
    assert len(listed) >= 8 and all(len(row) == 4 for row in psconfig.readme_env_rows())
    read = psconfig.env_read_by_code() - psconfig._INTERNAL_ENV
    assert "SPARK_PS_RETRY_HORIZON" in read
    missing = read - listed - psconfig.env_in_readme_key_table()
    assert not missing, f"read by the code, not in the README's table: {sorted(missing)}"


def test_the_params_page_tells_mllibs_params_from_spark_ps_additions():
    import sys

    sys.path.insert(0, str(ROOT / "docs" / "_ext"))
    try:
        import psparams
    finally:
        sys.path.remove(str(ROOT / "docs" / "_ext"))
    rows = {
        name: (default, in_mllib)
        for name, default, _, in_mllib in psparams.param_rows(
            "spark_ps.ml.classification.LogisticRegression",
            "pyspark.ml.classification.LogisticRegression",
        )
    }
    assert rows["maxIter"] == ("100", True) and rows["regParam"] == ("0.0", True)
    assert rows["numWorkers"][1] is False and rows["batchSize"][1] is False
    assert sum(in_mllib for _, in_mllib in rows.values()) >= 20


def test_the_configuration_page_lists_every_key_the_bridge_plugin_reads():
    psconfig = _psconfig()
    page = (ROOT / "docs" / "guide" / "configuration.rst").read_text()
    block = page.split(".. ps-plugin-keys::", 1)[1].split("\n\n\n", 1)[0]
    listed = set(psconfig._KEY_IN_CODE.findall(block)) | dict(psconfig.context_keys()).keys()
    read = psconfig.keys_read_by_plugin()
    assert {"mode", "numHosts", "executorShards", "joinWait"} <= read
    assert read <= listed, f"read by the plugin, not on the page: {sorted(read - listed)}"


def test_every_file_the_user_guide_names_exists():
    """A guide page that cites a test, bench script, manifest or module as the proof or the
    place of a claim names one that is there."""
    named = set()
    for page in (ROOT / "docs" / "guide").glob("*.rst"):
        named.update(
            re.findall(
                r"``((?:tests|bench|deploy|ps_server|spark_ps|examples|scripts)/[\w/.-]*[\w/])``",
                page.read_text(),
            )
        )
    assert {"tests/test_executor_mode.py", "bench/scale.py", "deploy/kubernetes/"} <= named
    built = "spark_ps/jars/"  # the bridge jar: made by scripts/setup.sh, not committed
    missing = sorted(p for p in named if not p.startswith(built) and not (ROOT / p).exists())
    assert not missing, f"named by the user guide, not in the repository: {missing}"
