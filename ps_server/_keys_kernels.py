"""The numba kernels behind :mod:`ps_server.keys_jit` (importing this module imports numba).

Hash tables here are linear-probing, power-of-two sized, homed at ``mix64(key) & mask``
(the splitmix64 finalizer of :func:`ps_server.keys.mix64`). The scratch table of the client
passes interleaves (key, unique index) per slot, so a probe touches one cache line; an
index of -1 marks an empty slot, so any int64 key can be stored.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30 = np.uint64(30)
_S27 = np.uint64(27)
_S31 = np.uint64(31)


@njit(nogil=True, cache=True, inline="always")
def _mix(k):
    z = np.uint64(k)
    z ^= z >> _S30
    z *= _M1
    z ^= z >> _S27
    z *= _M2
    z ^= z >> _S31
    return z


@njit(nogil=True, cache=True, inline="always")
def _shard(k, num_shards, bounds, dense):
    """Shard of key k: hash (``mix64 % n``) or range (last s with bounds[s] <= k)."""
    if num_shards == 1:
        return 0
    if not dense:
        return np.int64(_mix(k) % np.uint64(num_shards))
    lo, hi = 0, num_shards  # bounds[lo] <= k < bounds[hi] for valid keys
    while hi - lo > 1:
        mid = (lo + hi) >> 1
        if bounds[mid] <= k:
            lo = mid
        else:
            hi = mid
    return lo


@njit(nogil=True, cache=True)
def _hash_pass(keys, tab, mask, ukeys, slot_of):
    """slot_of[i] = the first-occurrence index of keys[i]; ukeys[u] = the u-th new key.
    Returns the number of unique keys; leaves `tab` empty again."""
    m = 0
    umask = np.uint64(mask)
    for i in range(keys.size):
        k = keys[i]
        s = np.int64(_mix(k) & umask)
        while True:
            u = tab[2 * s + 1]
            if u < 0:
                tab[2 * s] = k
                tab[2 * s + 1] = m
                ukeys[m] = k
                slot_of[i] = m
                m += 1
                break
            if tab[2 * s] == k:
                slot_of[i] = u
                break
            s = (s + 1) & mask
    for j in range(m):  # empty the slots used (a chain only holds smaller indices first)
        s = np.int64(_mix(ukeys[j]) & umask)
        while tab[2 * s + 1] != j:
            s = (s + 1) & mask
        tab[2 * s + 1] = -1
    return m


@njit(nogil=True, cache=True)
def _group(ukeys, m, num_shards, bounds, dense, offsets, pos):
    """pos[u] = place of unique key u once grouped by shard (stable); fills offsets.
    Returns True when the grouping is the identity."""
    sid = np.empty(m, dtype=np.int64)
    counts = np.zeros(num_shards, dtype=np.int64)
    for u in range(m):
        s = _shard(ukeys[u], num_shards, bounds, dense)
        s = min(max(s, 0), num_shards - 1)
        sid[u] = s
        counts[s] += 1
    offsets[0] = 0
    for s in range(num_shards):
        offsets[s + 1] = offsets[s] + counts[s]
    cursor = offsets[:-1].copy()
    identity = True
    for u in range(m):
        p = cursor[sid[u]]
        cursor[sid[u]] = p + 1
        pos[u] = p
        if p != u:
            identity = False
    return identity


@njit(nogil=True, cache=True)
def combine_route(keys, values, tab, mask, num_shards, bounds, dense, ukeys, uvals, offsets):
    """Unique keys and summed values (in input order), grouped by shard. Returns m."""
    n, cols = values.shape
    first = np.empty(n, dtype=np.int64)
    m = _hash_pass(keys, tab, mask, ukeys, first)
    if num_shards == 1:
        offsets[0] = 0
        offsets[1] = m
        place = first
    else:
        pos = np.empty(m, dtype=np.int64)
        if not _group(ukeys, m, num_shards, bounds, dense, offsets, pos):
            grouped = np.empty(m, dtype=np.int64)
            for u in range(m):
                grouped[pos[u]] = ukeys[u]
            ukeys[:m] = grouped
            for i in range(n):
                first[i] = pos[first[i]]
        place = first
    seen = np.zeros(m, dtype=np.bool_)
    for i in range(n):
        u = place[i]
        if seen[u]:
            for c in range(cols):
                uvals[u, c] += values[i, c]
        else:
            seen[u] = True
            for c in range(cols):
                uvals[u, c] = values[i, c]
    return m


@njit(nogil=True, cache=True)
def dedup_route(keys, tab, mask, num_shards, bounds, dense, ukeys, inverse, offsets):
    """Unique keys grouped by shard and inverse (unique[inverse] == keys).
    Returns (m, whether inverse is the identity)."""
    n = keys.size
    m = _hash_pass(keys, tab, mask, ukeys, inverse)
    if num_shards == 1:
        offsets[0] = 0
        offsets[1] = m
        return m, m == n
    pos = np.empty(m, dtype=np.int64)
    identity = _group(ukeys, m, num_shards, bounds, dense, offsets, pos)
    if identity:
        return m, m == n
    grouped = np.empty(m, dtype=np.int64)
    for u in range(m):
        grouped[pos[u]] = ukeys[u]
    ukeys[:m] = grouped
    for i in range(n):
        inverse[i] = pos[inverse[i]]
    return m, False


@njit(nogil=True, cache=True)
def route(keys, num_shards, bounds, dense, order, offsets):
    """order = positions grouped by shard (stable); True when that is the identity."""
    n = keys.size
    counts = np.zeros(num_shards, dtype=np.int64)
    for i in range(n):
        s = min(max(_shard(keys[i], num_shards, bounds, dense), 0), num_shards - 1)
        counts[s] += 1
    offsets[0] = 0
    for s in range(num_shards):
        offsets[s + 1] = offsets[s] + counts[s]
    cursor = offsets[:-1].copy()
    identity = True
    for i in range(n):
        s = min(max(_shard(keys[i], num_shards, bounds, dense), 0), num_shards - 1)
        p = cursor[s]
        cursor[s] = p + 1
        order[p] = i
        if p != i:
            identity = False
    return identity


@njit(nogil=True, cache=True)
def lookup(slot_keys, slot_rows, keys, out):
    """out[i] = row of keys[i] in a HashIndex table (slot key -1: empty), else -1."""
    mask = slot_keys.size - 1
    umask = np.uint64(mask)
    for i in range(keys.size):
        k = keys[i]
        s = np.int64(_mix(k) & umask)
        row = -1
        while True:
            found = slot_keys[s]
            if found == k:
                row = slot_rows[s]
                break
            if found == -1:
                break
            s = (s + 1) & mask
        out[i] = row


@njit(nogil=True, cache=True)
def insert(slot_keys, slot_rows, row_keys, n, keys, rows, start):
    """Find or insert keys[start:], numbering new rows n, n+1, ...; stops before an insert
    that would put the table above load 0.5. Returns (position reached, rows held)."""
    cap = slot_keys.size
    mask = cap - 1
    umask = np.uint64(mask)
    for i in range(start, keys.size):
        k = keys[i]
        s = np.int64(_mix(k) & umask)
        while True:
            found = slot_keys[s]
            if found == k:
                rows[i] = slot_rows[s]
                break
            if found == -1:
                if 2 * (n + 1) > cap:
                    return i, n
                slot_keys[s] = k
                slot_rows[s] = n
                row_keys[n] = k
                rows[i] = n
                n += 1
                break
            s = (s + 1) & mask
    return keys.size, n


@njit(nogil=True, cache=True)
def scatter_add(arr, rows, values):
    """arr[rows[i]] += values[i] in order (duplicates summed like np.add.at)."""
    cols = arr.shape[1]
    for i in range(rows.size):
        r = rows[i]
        for c in range(cols):
            arr[r, c] += values[i, c]


@njit(nogil=True, cache=True)
def gather(arr, rows, fill, out):
    """out[i] = arr[rows[i]], or fill where rows[i] is -1."""
    cols = arr.shape[1]
    for i in range(rows.size):
        r = rows[i]
        if r < 0:
            for c in range(cols):
                out[i, c] = fill
        else:
            for c in range(cols):
                out[i, c] = arr[r, c]
