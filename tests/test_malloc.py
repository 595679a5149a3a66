"""Message buffers are reused, not page-faulted in again for every request.

Each PS request and answer allocates and frees buffers of hundreds of KB to MBs. glibc's
default serves those from fresh mmaps, so every message pays a page fault per 4 KB page;
`keep_freed_memory` (set in shards and Spark workers) keeps them in the heap. Measured in a
child process, which is what a shard is, by its minor page faults.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ps_server import lifecycle

_CHILD = """
import json, resource, sys
import numpy as np
from ps_server.lifecycle import keep_freed_memory
was_set = keep_freed_memory() if sys.argv[1] == "keep" else False
def messages():  # buffers of the sizes requests and answers have, written, then freed
    for _ in range(30):
        for n in (50_000, 800_000, 200_000, 3_000_000):
            a = np.ones(n)
            b = a * 2
            del a, b
messages()  # warm: the heap grows once
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
messages()
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(json.dumps({"set": was_set, "faults": faults}))
"""


def _child(script: str, mode: str, env: dict) -> dict:
    """What a fresh Python running `script` with argument `mode` printed last (JSON)."""
    out = subprocess.run(
        [sys.executable, "-c", script, mode],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _faults(mode: str, **env: str) -> dict:
    return _child(_CHILD, mode, {**os.environ, **env})


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt")
def test_freed_message_buffers_are_reused_without_page_faults():
    default, kept = _faults("default"), _faults("keep")
    assert kept["set"] is True
    assert default["faults"] > 5_000  # measured ~59k: freed buffers went back to the kernel
    assert kept["faults"] < default["faults"] / 10  # measured 0


def test_the_policy_can_be_left_to_glibc():
    opted_out = _faults("keep", **{lifecycle.MALLOC_ENV: "default"})
    assert opted_out["set"] is False
    assert opted_out["faults"] > 5_000


_ADVICE_CHILD = """
import json, sys
import numpy as np
from ps_server.lifecycle import huge_page_advice, huge_page_advice_on
before = huge_page_advice(sys.argv[1] == "on")
now = huge_page_advice_on()
a = np.ones(8_000_000)  # 64 MB: numpy advises huge pages on arrays of 4 MB or more
addr, flags = a.ctypes.data + 8192, None  # numpy advises from the next whole page on
with open("/proc/self/smaps") as f:
    lines = f.read().splitlines()
inside = False
for line in lines:
    head = line.split()[0]
    if "-" in head and ":" not in head:
        lo, hi = (int(x, 16) for x in head.split("-"))
        inside = lo <= addr < hi
    elif inside and line.startswith("VmFlags:"):
        flags = line.split()[1:]
after = huge_page_advice(True)
print(json.dumps({"before": before, "now": now, "advised": "hg" in flags, "after": after}))
"""


def _advice(mode: str, **env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if k != lifecycle.HUGEPAGE_ENV}
    return _child(_ADVICE_CHILD, mode, {**clean, **env})


@pytest.mark.skipif(
    not os.path.isdir("/sys/kernel/mm/transparent_hugepage"),
    reason="a Linux kernel with transparent huge pages (madvise sets no flag without them)",
)
def test_workers_and_shards_ask_for_no_huge_pages_and_the_setting_is_restored():
    """The kernel sees the advice (``hg`` in the mapping's flags) only when it is on; the
    call returns the setting before it, so a task puts back what it found."""
    on, off = _advice("on"), _advice("off")
    assert on == {"before": True, "now": True, "advised": True, "after": True}
    assert off == {"before": True, "now": False, "advised": False, "after": False}
    # an operator's NUMPY_MADVISE_HUGEPAGE stands, whatever the call asks
    kept = _advice("off", **{lifecycle.HUGEPAGE_ENV: "1"})
    assert kept == {"before": None, "now": True, "advised": True, "after": None}
