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
