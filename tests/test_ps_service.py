"""Real shard processes over loopback gRPC: round trips, algebra, exactly-once, control plane."""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest

from spark_ps import PSMatrix, PSVector
from spark_ps.client import PSClient, get_client


def test_sparse_vector_round_trip_with_duplicate_keys(ps):
    w = PSVector.sparse(dim=2**62)
    keys = np.array([3, 2**61 + 5, 3, 17, 2**61 + 5], dtype=np.int64)
    w.increment(keys, np.array([1.0, 2.0, 3.0, 4.0, 5.0]))
    got = w.pull(np.array([17, 3, 2**61 + 5, 999, 3]))
    np.testing.assert_array_equal(got, [4.0, 4.0, 7.0, 0.0, 4.0])
    k, v = w.pull()
    np.testing.assert_array_equal(k, [3, 17, 2**61 + 5])
    np.testing.assert_array_equal(v, [4.0, 4.0, 7.0])
    # an untouched key pulled does not create a row
    assert sum(h.nbytes for h in ps.client.health()) > 0
    assert w.pull()[0].size == 3


def test_dense_vector_ops_run_on_servers_and_match_numpy(ps):
    rng = np.random.default_rng(0)
    dim = 1001
    a, b = rng.normal(size=dim), rng.normal(size=dim)
    x = PSVector.dense(dim)
    y = x.like()
    x.update(np.arange(dim), a)
    y.update(np.arange(dim), b)
    assert x.dot(y) == pytest.approx(a @ b, rel=1e-12)
    assert x.nrm2() == pytest.approx(np.linalg.norm(a), rel=1e-12)
    y.axpy(-0.5, x)
    y.scale(3.0)
    np.testing.assert_allclose(y.pull(), 3.0 * (b - 0.5 * a), rtol=1e-13)
    z = x.like()
    z.copy_from(y)
    assert z.sum() == pytest.approx(np.sum(3.0 * (b - 0.5 * a)), rel=1e-10)
    z.fill(2.0)
    np.testing.assert_array_equal(z.pull(), np.full(dim, 2.0))


def test_every_dot_product_of_a_pair_has_the_same_bits(ps):
    """A vector op's dot and nrm2, linalg.dots and lincombs_dots give a pair the same
    value bit for bit on vectors of several dot chunks per shard (the solver mixes them)."""
    from ps_server.functions.linalg import DOT_CHUNK
    from spark_ps.ml.lr.ps_space import PSVecSpace

    rng = np.random.default_rng(7)
    dim = 5 * DOT_CHUNK + 11  # over two chunks on each of two shards
    space = PSVecSpace(ps, dim, prefix="dotbits")
    a, b, c = (space.new(n) for n in "abc")
    for v in (a, b):
        v.update(np.arange(dim), rng.normal(size=dim) * 1e3)
    dots = space.dots([(a, b), (b, b), (a, a)])
    assert dots[0] == a.dot(b) == space.dots([(a, b)])[0]
    assert np.sqrt(dots[1]) == b.nrm2()
    fused = space.lincombs_dots([(c, [(1.0, a)])], [(b, a), (c, b)])
    assert fused == [dots[0], dots[0]]
    space.release_all()


def test_fused_solver_calls_match_the_separate_ops(ps):
    """linalg.dots with picked values and linalg.lincombs_dots: one request per shard, the
    same numbers as pull/dot and lincomb-then-dots."""
    from spark_ps.ml.lr.ps_space import PSVecSpace

    rng = np.random.default_rng(2)
    dim = 1001
    space = PSVecSpace(ps, dim, prefix="fused")
    a, b, c = (space.new(n) for n in "abc")
    for v in (a, b, c):
        v.update(np.arange(dim), rng.normal(size=dim))
    va, vb, vc = a.pull(), b.pull(), c.pull()
    out = ps.client.call(
        "linalg.dots", [a.spec, b.spec], {"pairs": [[0, 1]], "pick": [[0, dim - 1], [1, 3]]}
    )
    got = np.sum([arr[0] for _, arr in out], axis=0)
    assert got[0] == a.dot(b)
    assert got[1:].tolist() == [va[-1], vb[3]]
    with pytest.raises(Exception, match="not in"):
        ps.client.call("linalg.dots", [a.spec], {"pairs": [], "pick": [[0, dim]]})
    s1, s2 = space.new("s1"), space.new("s2")
    dots = space.lincombs_dots([(s1, [(1.0, a), (-2.0, b)]), (c, [(0.5, c), (1.0, s1)])], [(s1, c)])
    np.testing.assert_array_equal(s1.pull(), 1.0 * va + -2.0 * vb)
    np.testing.assert_array_equal(c.pull(), 0.5 * vc + 1.0 * (va - 2.0 * vb))
    space.lincomb(s2, [(1.0, a), (-2.0, b)])
    assert dots == [s2.dot(c)]
    before = s2.pull()
    with pytest.raises(Exception, match="0 coefficients for 0 vectors"):  # on every shard
        ps.client.call("linalg.lincomb", [s2.spec], {"coeffs": []})
    np.testing.assert_array_equal(s2.pull(), before)
    space.release_all()


def test_statistics_and_dense_key_numbering_on_the_shards(ps):
    """stats.standardize turns summed [count, s1, s2] and [max x, max -x] rows into MLlib's
    mean and std; keyspace.number numbers a dense keyset's non-zeros in key order."""
    import scipy.sparse

    from spark_ps.data import CSRBatch
    from spark_ps.ml.lr.objective import feature_stats, finalize_stats

    rng = np.random.default_rng(3)
    n, d = 400, 37
    X = rng.normal(size=(n, d)) * (rng.uniform(size=(n, d)) < 0.3)
    X[:, 5] = 0.0  # never stored
    X[:, 6] = 2.5  # constant, stored in every row
    w = rng.uniform(0.5, 2.0, n)
    y = (rng.uniform(size=n) < 0.4).astype(float)
    m = scipy.sparse.csr_matrix(X)
    p = feature_stats([CSRBatch(m.indptr, m.indices, m.data, d, y, w)])
    want = finalize_stats(p)
    sums = PSMatrix.dense(d, 3)
    ext = PSMatrix.dense(d, 2)
    sums.update(p.keys, np.column_stack([p.count.astype(float), p.s1, p.s2]))
    ext.update(p.keys, np.column_stack([p.vmax, -p.vmin]))
    mean, std = PSVector.dense(d), PSVector.dense(d)
    ps.client.call(
        "stats.standardize",
        [sums.spec, ext.spec, mean.spec, std.spec],
        {"weight_sum": p.weight_sum, "weight_sq_sum": p.weight_sq_sum, "n_rows": p.n_rows},
    )
    np.testing.assert_allclose(mean.pull(), want.dense("mean"), rtol=1e-14, atol=1e-300)
    np.testing.assert_allclose(std.pull(), want.dense("std"), rtol=1e-12, atol=1e-300)
    assert std.pull()[[5, 6]].tolist() == [0.0, 0.0]
    with pytest.raises(Exception, match="co-located"):
        ps.client.call("stats.standardize", [sums.spec, sums.spec, mean.spec, std.spec], {})
    # a fourth column sum(w*y*x) gives the data gradient where every margin is b0
    sums4, start = PSMatrix.dense(d, 4), PSVector.dense(d)
    wy = (X * (w * y)[:, None]).sum(axis=0)
    sums4.update(p.keys, np.column_stack([p.count.astype(float), p.s1, p.s2, wy[p.keys]]))
    scalars = {"weight_sum": p.weight_sum, "weight_sq_sum": p.weight_sq_sum, "n_rows": p.n_rows}
    models = [sums4.spec, ext.spec, mean.spec, std.spec, start.spec]
    before = mean.pull(), std.pull()
    for bad in ({"start_s1": 0.3}, {"start_s1": 0.3, "start_sy": math.nan}):
        with pytest.raises(Exception, match="'start_sy' must be a finite number"):
            ps.client.call("stats.standardize", models, scalars | bad)
    with pytest.raises(Exception, match="must differ"):  # the start would overwrite std
        ps.client.call("stats.standardize", models[:4] + [std.spec], scalars)
    assert not start.pull().any()  # refused: nothing written
    np.testing.assert_array_equal(mean.pull(), before[0])
    np.testing.assert_array_equal(std.pull(), before[1])
    ps.client.call("stats.standardize", models, scalars | {"start_s1": 0.3, "start_sy": -1.0})
    rows_pass = X.T @ (w * (0.3 - y))
    np.testing.assert_allclose(start.pull(), rows_pass, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(std.pull(), want.dense("std"), rtol=1e-12, atol=1e-300)
    keyset = PSVector.dense(10_000)
    touched = np.array([3, 17, 4999, 5000, 9999])
    keyset.update(touched, np.ones(touched.size))
    counts = [r["count"] for r, _ in ps.client.call("keyspace.count", [keyset.spec])]
    assert sum(counts) == touched.size
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]])
    res = ps.client.call(
        "keyspace.number", [keyset.spec], arrays=[[np.array([o])] for o in offsets]
    )
    assert np.concatenate([a[0] for _, a in res]).tolist() == touched.tolist()
    np.testing.assert_array_equal(keyset.pull(touched), np.arange(touched.size))


def test_shards_run_single_threaded_blas_unless_told_otherwise(ps):
    """Shard processes get OPENBLAS/OMP/MKL_NUM_THREADS=1 (BLAS threads spinning beside the
    other shards and the workers cost ~10x the CPU of a shard's vector work)."""
    import os

    import psutil

    shards = [
        p for p in psutil.Process(ps.process.pid).children() if "ps_server.shard" in p.cmdline()
    ]
    assert len(shards) == 2
    for p in shards:
        env = p.environ()
        for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            assert env.get(var) == os.environ.get(var, "1")


def test_matrix_rows_and_server_side_optimizer(ps):
    m = PSMatrix.dense(6, 3, optimizer="sgd", lr=0.5)
    m.push(np.array([1, 4, 1]), np.ones((3, 3)))
    got = m.pull(np.array([0, 1, 4]))
    np.testing.assert_array_equal(got, [[0, 0, 0], [-1, -1, -1], [-0.5, -0.5, -0.5]])


def test_large_payloads_are_chunked(ps):
    client = PSClient(ps.address, ps.token, max_message_bytes=64 << 10)  # force many chunks
    w = PSVector.dense(300_000)
    keys = np.arange(300_000, dtype=np.int64)[::-1].copy()
    client.push(w.spec, keys, keys.astype(np.float64), "add")
    np.testing.assert_array_equal(client.pull(w.spec, np.arange(300_000)), np.arange(300_000.0))
    np.testing.assert_array_equal(w.pull(), np.arange(300_000.0))
    client.close()


def test_concurrent_clients_sum_exactly(ps):
    w = PSVector.sparse(dim=2**40)
    keys = np.random.default_rng(1).integers(0, 2**40, size=2000)

    def worker(seed):
        c = PSClient(ps.address, ps.token)
        for _ in range(10):
            c.push(w.spec, keys, np.ones(keys.size), "add")
        c.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    uniq, counts = np.unique(keys, return_counts=True)
    np.testing.assert_array_equal(w.pull(uniq), 40.0 * counts)


def test_exactly_once_contribution_replaces_a_retry(ps):
    g = PSVector.dense(50)
    k = np.arange(50)
    g.aggregate(k, np.ones(50), round=1, part=0)
    g.aggregate(k, np.full(50, 100.0), round=1, part=1)  # first attempt of part 1 ...
    g.aggregate(k, np.full(50, 2.0), round=1, part=1)  # ... replaced by its retry
    g.reduce(1)
    np.testing.assert_array_equal(g.pull(), np.full(50, 3.0))
    g.aggregate(k[:10], np.ones(10), round=2, part=0)
    g.reduce(2, op="add")
    np.testing.assert_array_equal(g.pull(), np.r_[np.full(10, 4.0), np.full(40, 3.0)])


@pytest.mark.parametrize("kind", ["dense", "sparse"])
def test_a_replay_split_differently_replaces_every_chunk_of_its_first_attempt(ps, kind):
    """A replayed part may split into fewer chunks (less data, another chunk size) or send
    a shard no keys at all: nothing of its first attempt may stay in the sum."""
    g = PSVector.dense(400) if kind == "dense" else PSVector.sparse(dim=400)
    small = PSClient(ps.address, ps.token, max_message_bytes=256)  # 16 rows per chunk
    k = np.arange(400)
    try:
        small.push(g.spec, k, np.full(400, 100.0), round=1, part=0)  # many chunks per shard
        g.aggregate(k, np.ones(400), round=1, part=0)  # the replay: one chunk per shard
        g.aggregate(k, np.full(400, 2.0), round=1, part=1)
        g.reduce(1)
        np.testing.assert_array_equal(g.pull(k), np.full(400, 3.0))
        g.aggregate(k, np.full(400, 50.0), round=2, part=0)  # keys on both shards ...
        first = k[g.spec.route(k)[0]]  # the keys shard 0 owns; shard 1 gets none
        assert 0 < first.size < 400
        g.aggregate(first, np.ones(first.size), round=2, part=0)  # ... the replay on one
        g.reduce(2, op="add")
        want = np.full(400, 3.0)
        want[first] += 1.0
        np.testing.assert_array_equal(g.pull(k), want)
    finally:
        small.close()


def test_round_board_and_collect(ps):
    c = ps.client
    c.post("fit-x/cmd", 3, {"op": "grad"})
    assert c.wait("fit-x/cmd", 3, timeout=5) == (3, {"op": "grad"})
    c.contribute("fit-x/loss", 3, 1, np.array([1.0, 2.0]))
    c.contribute("fit-x/loss", 3, 0, np.array([10.0, 20.0]))
    c.contribute("fit-x/loss", 3, 1, np.array([5.0, 6.0]))  # retry replaces
    np.testing.assert_array_equal(c.collect("fit-x/loss", 3, 2, timeout=5), [15.0, 26.0])


def test_barrier_and_removed_worker_releases_it(ps):
    c = ps.client
    done = []

    def arrive(w):
        get_client(ps.address, ps.token).barrier("b1", w, 3, timeout=20)
        done.append(w)

    ts = [threading.Thread(target=arrive, args=(f"w{i}",)) for i in range(2)]
    for t in ts:
        t.start()
    c.remove_worker("b1", "w2")  # the third worker died: the other two go on
    for t in ts:
        t.join(25)
    assert sorted(done) == ["w0", "w1"]


def test_ssp_clock_blocks_fast_worker_until_slow_catches_up(ps):
    order = []

    def report(worker, clock):
        PSClient(ps.address, ps.token).clock(
            "g", worker, clock, staleness=1, num_workers=2, timeout=20
        )
        order.append(f"{worker}-{clock}")

    slow = threading.Thread(target=report, args=("slow", 1))
    fast = threading.Thread(target=report, args=("fast", 3))
    slow.start()
    fast.start()
    slow.join(10)
    fast.join(1.0)
    assert order == ["slow-1"] and fast.is_alive()  # fast is 2 ahead of slow: it must wait
    report("slow", 2)  # now fast is within 1 clock of slow: released
    fast.join(10)
    assert not fast.is_alive() and sorted(order) == ["fast-3", "slow-1", "slow-2"]


def test_checkpoint_and_restore(ps, tmp_path):
    w = PSVector.sparse(dim=2**40, optimizer="adagrad", lr=0.1)
    keys = np.array([1, 2**35, 77])
    w.push(keys, np.array([1.0, -2.0, 3.0]))
    before = w.pull(keys)
    version = ps.checkpoint(str(tmp_path))
    w.push(keys, np.array([5.0, 5.0, 5.0]))
    assert not np.array_equal(w.pull(keys), before)
    assert ps.recover(str(tmp_path)) == version
    np.testing.assert_array_equal(w.pull(keys), before)


def test_reduce_max_over_parts_and_dense_sum_in_part_order(ps):
    v = PSVector.dense(10)
    v.aggregate(np.array([1, 3]), np.array([5.0, -2.0]), round=1, part=0)
    v.aggregate(np.array([3, 8]), np.array([-7.0, 4.0]), round=1, part=1)
    v.reduce(1, how="max")
    np.testing.assert_array_equal(v.pull(), [0, 5, 0, -2, 0, 0, 0, 0, 4, 0])
    s = PSVector.sparse(2**50)
    s.aggregate(np.array([2**45, 7]), np.array([1.0, 9.0]), round=4, part=1)
    s.aggregate(np.array([2**45]), np.array([3.0]), round=4, part=0)
    s.reduce(4, how="max")
    np.testing.assert_array_equal(s.pull(np.array([7, 2**45])), [9.0, 3.0])


def test_bounded_load_has_no_errors():
    from bench.load import run

    row = run(clients=3, requests=40, keys=500, shards=2)
    assert row["errors"] == 0 and row["requests"] == 120
    assert row["after MB"] < row["shard RSS before MB"] + 200  # no runaway growth


def test_embedding_rows_are_initialised_on_first_pull_from_seed_and_id(ps):
    from spark_ps import PSEmbedding

    e = PSEmbedding.create(8, init="normal", scale=0.1, seed=3, optimizer="sgd", lr=1.0)
    ids = np.array([2**50, 7, 2**50])
    first = e.pull(ids)
    assert first.shape == (3, 8) and np.all(first[0] == first[2]) and first.std() > 0.01
    np.testing.assert_array_equal(e.pull(ids[:2]), first[:2])  # stored, not redrawn
    other = PSEmbedding.create(8, init="normal", scale=0.1, seed=3)
    np.testing.assert_array_equal(other.pull(np.array([7])), first[1:2])  # (seed, id) decide
    e.push(np.array([7]), np.ones((1, 8), dtype=np.float32))
    np.testing.assert_allclose(e.pull(np.array([7])), first[1:2] - 1.0, rtol=1e-6)
    k, _ = e.pull()
    np.testing.assert_array_equal(k, [7, 2**50])  # memory grows with ids touched


def test_console_script_help():
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "ps_server", "--help"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0 and "--shards" in out.stdout and "spark.ps.address" in out.stdout


def test_class_matrices_per_column_ops_match_numpy(ps):
    """A [rows, K] space (multinomial LR): flat BLAS-1 and kernels, per-column dots and axpy,
    a vector spread over the columns; whole rows per shard, same numbers as NumpyVecSpace."""
    from spark_ps.ml.lr.ps_space import PSVecSpace
    from spark_ps.ml.lr.vecspace import NumpyVecSpace

    rng = np.random.default_rng(4)
    rows, K = 1001, 4
    space = PSVecSpace(ps, rows, prefix="classes", cols=K)
    local = NumpyVecSpace(rows, shards=ps.num_shards, cols=K)
    A, B = rng.normal(size=(rows, K)), rng.normal(size=(rows, K))
    a, b = space.new("a"), space.new("b")
    assert isinstance(a, PSMatrix) and a.spec.cols == K
    a.update(np.arange(rows), A)
    b.update(np.arange(rows), B)
    la, lb = local.from_array("a", A.ravel()), local.from_array("b", B.ravel())
    assert space.dot(a, b) == pytest.approx(float(np.sum(A * B)), rel=1e-12)
    got = space.col_dots([(a, b)], rows=[(a, rows - 1), (b, 7)])
    want = np.concatenate([np.einsum("ij,ij->j", A, B), A[-1], B[7]])
    np.testing.assert_allclose(got, want, rtol=1e-12)
    np.testing.assert_allclose(local.col_dots([(la, lb)], rows=[(la, rows - 1), (lb, 7)]), want)
    coeffs = np.array([1.0, -2.0, 0.5, 3.0])
    space.col_axpy(coeffs, a, b)
    local.col_axpy(coeffs, la, lb)
    np.testing.assert_array_equal(b.pull(np.arange(rows)), B + coeffs * A)
    np.testing.assert_array_equal(lb.reshape(rows, K), B + coeffs * A)
    v = PSVector.dense(rows, name="classes/v")
    values = rng.normal(size=rows)
    v.update(np.arange(rows), values)
    space.spread(a, v)
    np.testing.assert_array_equal(a.pull(np.arange(rows)), np.repeat(values[:, None], K, axis=1))
    with pytest.raises(Exception, match=r"row 1001 .* not in \[0, 1001\)"):
        space.col_dots([], rows=[(a, rows)])
    with pytest.raises(Exception, match="3 coefficients for 4 columns"):
        space.col_axpy(coeffs[:3], a, b)
    other = PSVector.dense(rows + 1, name="classes/other")
    with pytest.raises(Exception, match="not a vector row-co-located"):
        space.spread(a, other)
    np.testing.assert_array_equal(a.pull(np.arange(rows)), np.repeat(values[:, None], K, axis=1))
    for t in (v, other):
        t.drop()
    space.release_all()
