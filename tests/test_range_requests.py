"""Dense pulls and pushes that travel as a range (``spark_ps.client.client._span``).

Keys of a dense tensor that fill most of the range they span are sent as the range: a
push sums its rows into the range's values (untouched rows get 0 added), a pull reads
the range and picks its keys out of it. Real shard processes; every result is compared
with a plain numpy reference, and refusals leave the tensor as it was.
"""

from __future__ import annotations

import uuid

import grpc
import numpy as np
import pytest

from ps_server.proto import ps_pb2 as pb
from ps_server.wire import TOKEN_KEY, to_array
from spark_ps.client import PSError, get_client
from spark_ps.client.client import _span
from spark_ps.client.spec import TensorSpec


@pytest.fixture()
def client(ps):
    return get_client(ps.address, ps.token)


def _dense(client, dim: int, cols: int = 1, **kw) -> TensorSpec:
    spec = TensorSpec(f"range-{uuid.uuid4().hex[:8]}", "dense", dim, cols, client.num_shards, **kw)
    client.create(spec)
    return spec


def _keys_with_duplicates(rng, lo: int, hi: int, n: int) -> np.ndarray:
    """`n` keys in [lo, hi] with repeats, both ends included, in random order."""
    keys = np.concatenate([[lo, hi, lo], rng.integers(lo, hi + 1, n - 3)])
    return rng.permutation(keys).astype(np.int64)


@pytest.mark.parametrize("cols,dtype", [(1, "float64"), (3, "float64"), (1, "float32")])
def test_range_pushes_and_pulls_equal_the_numpy_reference(client, cols, dtype):
    dim = 10_001
    spec = _dense(client, dim, cols, dtype=dtype)
    rng = np.random.default_rng(cols)
    ref = np.zeros((dim, cols))
    keys = _keys_with_duplicates(rng, 0, dim - 1, 12_000)  # fills [0, dim): a range push
    assert _span(spec, keys) == (0, dim)
    values = rng.normal(size=(keys.size, cols)).astype(dtype)
    client.push(spec, keys, values)
    np.add.at(ref, keys, values.astype(np.float64))
    part = _keys_with_duplicates(rng, 4_000, 7_000, 2_500)  # a sub-range, across shards
    assert _span(spec, part) == (4_000, 3_001)
    more = rng.normal(size=(part.size, cols)).astype(dtype)
    client.push(spec, part, more)
    np.add.at(ref, part, more.astype(np.float64))
    tol = {"rtol": 1e-6, "atol": 1e-5} if dtype == "float32" else {"rtol": 1e-12, "atol": 1e-12}
    shuffled = rng.permutation(np.arange(100, 5_100))  # a whole range, out of order
    pulls = (keys, part, part[::-1], shuffled, np.arange(dim), np.array([dim - 1, 0, dim - 1]))
    for pulled in pulls:
        got = client.pull(spec, pulled).reshape(pulled.size, cols)
        np.testing.assert_allclose(got, ref[pulled], **tol)  # order and repeats kept
    keys_all, values_all = client.pull_all(spec)
    np.testing.assert_array_equal(keys_all, np.arange(dim))
    np.testing.assert_allclose(values_all.reshape(dim, cols), ref, **tol)
    client.drop(spec)


def test_a_run_is_set_and_stepped_as_its_keys_would_be(client):
    """set and step take the range only for a run of keys (k, k+1, ...): every row is
    the caller's, so no row gets a 0 it did not send; the result equals the keyed path."""
    dim, opt = 3_000, (("lr", 0.5),)
    ranged = _dense(client, dim, optimizer="adagrad", opt_params=opt)
    keyed = _dense(client, dim, optimizer="adagrad", opt_params=opt)
    rng = np.random.default_rng(1)
    start = rng.normal(size=dim)
    grads = [rng.normal(size=dim) for _ in range(3)]
    client.push(ranged, np.arange(dim), start, "set")
    order = rng.permutation(dim)  # the same rows, not a run: keys on the wire
    client.push(keyed, order, start[order], "set")
    for g in grads:
        client.push(ranged, np.arange(dim), g, "step")
        client.push(keyed, order, g[order], "step", unique=True)
    np.testing.assert_array_equal(
        client.pull(ranged, np.arange(dim)), client.pull(keyed, np.arange(dim))
    )
    # a set of a few keys in a wide span keeps the other rows as they are
    client.push(ranged, np.array([5, 2_000]), np.array([1.0, 2.0]), "set")
    got = client.pull(ranged, np.arange(dim))
    assert got[5] == 1.0 and got[2_000] == 2.0
    assert np.array_equal(
        np.delete(got, [5, 2_000]), np.delete(client.pull(keyed, np.arange(dim)), [5, 2_000])
    )
    client.drop(ranged)
    client.drop(keyed)


def test_one_key_empty_keys_and_the_edges(client):
    dim = 2**20
    spec = _dense(client, dim)
    client.push(spec, np.array([dim - 1]), np.array([2.5]))
    client.push(spec, np.zeros(0, np.int64), np.zeros(0))
    client.push(spec, np.array([0, 1, 0]), np.array([1.0, 1.0, 1.0]))
    assert client.pull(spec, np.zeros(0, np.int64)).shape == (0,)
    np.testing.assert_array_equal(
        client.pull(spec, np.array([dim - 1, 0, 1, 2])), [2.5, 2.0, 1.0, 0.0]
    )
    with pytest.raises(ValueError, match=r"key 1048576 at position 1 is outside \[0, 1048576\)"):
        client.push(spec, np.array([0, dim]), np.ones(2))
    client.drop(spec)


def _raw(client, spec: TensorSpec, request: pb.PushRequest, shard: int = 0):
    md = ((TOKEN_KEY, client.token),)
    return client.shards[shard].Push(request, metadata=md, timeout=30)


def test_a_shard_refuses_bad_range_pushes_and_changes_nothing(client):
    """Out of the shard's slice (one past its last key), to a sparse tensor, as an
    exactly-once contribution, NaN under the default policy: each refused by name."""
    spec = _dense(client, 100)
    hi = int(spec.bounds()[1])  # shard 0 holds [0, hi)
    client.push(spec, np.arange(100), np.arange(100.0), "set")
    cases = [
        (dict(start=hi - 2, values=to_array(np.ones(3))), grpc.StatusCode.OUT_OF_RANGE,
         f"range [{hi - 2}, {hi + 1}) outside [0, {hi})"),
        (dict(start=-1, values=to_array(np.ones(2))), grpc.StatusCode.OUT_OF_RANGE, "outside"),
        (dict(start=0, values=to_array(np.ones(2)), aggregate=True, round=1),
         grpc.StatusCode.INVALID_ARGUMENT, "a contribution needs keys"),
        (dict(start=0, values=to_array(np.array([1.0, np.nan]))),
         grpc.StatusCode.INVALID_ARGUMENT, "non-finite value nan at row 1"),
        (dict(start=0, values=to_array(np.ones((2, 2)))),
         grpc.StatusCode.INVALID_ARGUMENT, "do not match 2 keys x 1 cols"),
    ]  # fmt: skip
    for fields, code, message in cases:
        with pytest.raises(grpc.RpcError) as e:
            _raw(client, spec, pb.PushRequest(model=spec.name, by_range=True, **fields))
        assert e.value.code() == code and message in e.value.details(), e.value.details()
    np.testing.assert_array_equal(client.pull(spec, np.arange(100)), np.arange(100.0))
    sparse = TensorSpec(f"range-s-{uuid.uuid4().hex[:8]}", "sparse", 2**40, 1, client.num_shards)
    client.create(sparse)
    with pytest.raises(grpc.RpcError, match="a by-range request needs a dense tensor"):
        _raw(
            client,
            sparse,
            pb.PushRequest(model=sparse.name, by_range=True, values=to_array(np.ones(1))),
        )
    client.drop(sparse)
    client.drop(spec)


def test_nan_rows_are_skipped_from_a_range_push_under_the_skip_policy(client):
    spec = _dense(client, 1_000, nan_policy="skip")
    values = np.ones(1_000)
    values[[3, 999]] = [np.nan, np.inf]
    client.push(spec, np.arange(1_000), values)  # a run: the range, rows 3 and 999 dropped
    got = client.pull(spec, np.arange(1_000))
    expected = np.ones(1_000)
    expected[[3, 999]] = 0.0
    np.testing.assert_array_equal(got, expected)
    strict = _dense(client, 1_000)
    with pytest.raises(PSError, match="non-finite"):
        client.push(strict, np.arange(1_000), values)
    np.testing.assert_array_equal(client.pull(strict, np.arange(1_000)), np.zeros(1_000))
    client.drop(spec)
    client.drop(strict)
