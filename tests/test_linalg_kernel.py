"""The shards' compiled linear combination (ps_server.functions.linalg_jit): the same bits
as the plain numpy sum term by term, for every length around its block size, every
number of terms around its four-at-a-time loop, in place, and on special values."""

from __future__ import annotations

import numpy as np
import pytest

from ps_server.functions import linalg, linalg_jit


def _reference(terms) -> np.ndarray:
    """``c0 * v0 + c1 * v1 + ...`` in that order, one whole-vector numpy op at a time."""
    acc = terms[0][1] * terms[0][0]
    for c, v in terms[1:]:
        acc = acc + v * c
    return acc


@pytest.fixture(scope="module")
def kernel():
    k = linalg_jit.kernel()
    if k is None:
        pytest.skip("numba is not installed or SPARK_PS_NO_JIT is set")
    return k


B = linalg_jit.BLOCK


@pytest.mark.parametrize("n", [0, 1, 7, B - 1, B, B + 1, 3 * B + 5])
@pytest.mark.parametrize("n_terms", [1, 2, 4, 5, 8, 21, 22])
def test_the_combination_equals_numpy_bit_for_bit(kernel, n, n_terms):
    rng = np.random.default_rng(n * 31 + n_terms)
    vecs = [rng.normal(size=n) * 10.0 ** rng.integers(-8, 8) for _ in range(n_terms)]
    coeffs = rng.normal(size=n_terms) * 10.0 ** rng.integers(-5, 5, size=n_terms)
    out = np.full(n, np.nan)
    kernel(out, coeffs, vecs)
    np.testing.assert_array_equal(out, _reference(list(zip(coeffs, vecs, strict=True))))


@pytest.mark.parametrize("at", [0, 3, 20])
def test_in_place_the_output_term_is_read_before_it_is_written(kernel, at):
    """``x = x + t * d`` and the like: `out` among the terms, anywhere."""
    rng = np.random.default_rng(at)
    n = 2 * B + 3
    vecs = [rng.normal(size=n) for _ in range(21)]
    coeffs = rng.normal(size=21)
    want = _reference(list(zip(coeffs, vecs, strict=True)))
    out = vecs[at]
    kernel(out, coeffs, vecs)
    np.testing.assert_array_equal(out, want)


def test_special_values_propagate_as_in_numpy(kernel):
    tiny = np.nextafter(0.0, 1.0)  # a subnormal
    a = np.array([np.inf, -np.inf, np.nan, -0.0, tiny, 1e308, 0.0, 1.0, -1.0])
    b = np.array([1.0, np.inf, 0.0, -0.0, tiny, 1e308, -0.0, np.inf, np.nan])
    for coeffs in ([1.0, 1.0], [-0.0, 2.0], [0.5, -1e-300]):
        out = np.empty(a.size)
        with np.errstate(all="ignore"):
            kernel(out, np.array(coeffs), [a, b])
            want = _reference(list(zip(coeffs, [a, b], strict=True)))
        np.testing.assert_array_equal(out, want)
        np.testing.assert_array_equal(np.signbit(out), np.signbit(want))


def test_the_server_function_takes_the_kernel_and_numpy_for_other_dtypes():
    """``linalg._combine`` (behind lincomb and lincombs_dots): float64 vectors through the
    kernel, float32 ones through numpy's blocks; both the numpy sum's bits."""
    rng = np.random.default_rng(5)
    for dtype in ("float64", "float32"):
        vecs = [rng.normal(size=B + 9).astype(dtype) for _ in range(6)]
        coeffs = [float(c) for c in rng.normal(size=6)]
        out = np.empty(B + 9, dtype=dtype)
        linalg._combine(out, list(zip(coeffs, vecs, strict=True)))
        want = _reference(list(zip(coeffs, vecs, strict=True))).astype(dtype)
        np.testing.assert_array_equal(out, want)


C = linalg.DOT_CHUNK


@pytest.mark.parametrize("n", [0, 1, C, C + 1, 3 * C + 7])
def test_pair_dots_sum_np_dot_chunk_by_chunk_whatever_else_is_asked(n):
    """A pair's dot is its chunks' np.dot added in order (np.dot's own value within one
    chunk), and the same whether it is asked alone or with other pairs."""
    rng = np.random.default_rng(n)
    vecs = [rng.normal(size=n) * 10.0 ** rng.integers(-6, 6) for _ in range(5)]
    pairs = [(0, 1), (2, 2), (4, 0), (3, 1)]
    got = linalg.pair_dots(vecs, pairs)
    for (i, j), value in zip(pairs, got, strict=True):
        want = float(np.dot(vecs[i][:C], vecs[j][:C]))
        for lo in range(C, n, C):
            want += float(np.dot(vecs[i][lo : lo + C], vecs[j][lo : lo + C]))
        assert value == want
        assert linalg.pair_dots(vecs, [(i, j)]) == [value]
        if n <= C:
            assert value == float(np.dot(vecs[i], vecs[j]))
