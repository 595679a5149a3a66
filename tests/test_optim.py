"""Server-side optimizers: multi-step sparse trajectories against scalar Python references."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ps_server.shard.optim import OPTIMIZERS, make_optimizer
from ps_server.shard.storage import DenseStore, SparseStore

COLS = 3
N_KEYS = 40


class Reference:
    """One coordinate at a time, straight from the textbook formulas."""

    def __init__(self, name, p, w0):
        self.name, self.p, self.w = name, p, {k: list(v) for k, v in w0.items()}
        self.state: dict[tuple[int, int], dict[str, float]] = {}

    def _init_state(self):
        if self.name == "adagrad":
            return {"acc": self.p.get("initial_accumulator", 0.0)}
        return {"v": 0.0, "m": 0.0, "t": 0, "z": 0.0, "n": 0.0}

    def step(self, keys, grads):
        for k, g_row in zip(keys, grads, strict=True):
            for c, g in enumerate(g_row):
                s = self.state.setdefault((k, c), self._init_state())
                self.w[k][c] = getattr(self, self.name)(self.w[k][c], float(g), s)

    def sgd(self, w, g, s):
        return w - self.p["lr"] * g

    def momentum(self, w, g, s):
        s["v"] = self.p.get("momentum", 0.9) * s["v"] + g
        return w - self.p["lr"] * s["v"]

    def adagrad(self, w, g, s):
        s["acc"] += g * g
        return w - self.p["lr"] * g / (math.sqrt(s["acc"]) + self.p.get("eps", 1e-8))

    def adam(self, w, g, s):
        b1, b2 = self.p.get("beta1", 0.9), self.p.get("beta2", 0.999)
        s["t"] += 1
        s["m"] = b1 * s["m"] + (1 - b1) * g
        s["v"] = b2 * s["v"] + (1 - b2) * g * g
        m_hat, v_hat = s["m"] / (1 - b1 ** s["t"]), s["v"] / (1 - b2 ** s["t"])
        return w - self.p["lr"] * m_hat / (math.sqrt(v_hat) + self.p.get("eps", 1e-8))

    def ftrl(self, w, g, s):
        alpha, beta = self.p["alpha"], self.p.get("beta", 1.0)
        l1, l2 = self.p.get("l1", 0.0), self.p.get("l2", 0.0)
        sigma = (math.sqrt(s["n"] + g * g) - math.sqrt(s["n"])) / alpha
        s["z"] += g - sigma * w
        s["n"] += g * g
        if abs(s["z"]) <= l1:
            return 0.0
        sign = 1.0 if s["z"] > 0 else -1.0
        return -(s["z"] - sign * l1) / ((beta + math.sqrt(s["n"])) / alpha + l2)


CASES = [
    ("sgd", {"lr": 0.1}),
    ("momentum", {"lr": 0.05}),
    ("momentum", {"lr": 0.05, "momentum": 0.5}),
    ("adagrad", {"lr": 0.3, "initial_accumulator": 0.1}),
    ("adagrad", {"lr": 0.3, "eps": 1e-3}),
    ("adam", {"lr": 0.01}),
    ("adam", {"lr": 0.02, "beta1": 0.5, "beta2": 0.9, "eps": 1e-6}),
    ("ftrl", {"alpha": 0.1}),
    ("ftrl", {"alpha": 0.5, "beta": 0.5, "l1": 0.3, "l2": 0.1}),
]


def _run(store, name, params, steps=12, seed=20):
    """Random duplicate-free sparse pushes; returns (touched keys, reference)."""
    rng = np.random.default_rng(seed)
    all_keys = np.arange(N_KEYS, dtype=np.int64) * 1_000_003 + 5  # spread-out keys
    if isinstance(store, DenseStore):
        all_keys = np.arange(N_KEYS, dtype=np.int64) + store.offset
    w0 = rng.standard_normal((N_KEYS, COLS))
    store.assign(all_keys, w0)
    opt = make_optimizer(name, params)
    opt.attach(store)
    ref = Reference(name, params, dict(zip(all_keys.tolist(), w0, strict=True)))
    touched: set[int] = set()
    for _ in range(steps):
        keys = rng.choice(all_keys[: N_KEYS - 5], size=rng.integers(1, 15), replace=False)
        grads = rng.standard_normal((keys.size, COLS))
        opt.step(store, store.locate(keys, create=True), grads)
        ref.step(keys.tolist(), grads)
        touched.update(keys.tolist())
    return all_keys, w0, touched, ref


@pytest.mark.parametrize("name,params", CASES)
@pytest.mark.parametrize("kind", ["sparse", "dense"])
def test_trajectory_matches_reference(name, params, kind):
    store = SparseStore(COLS, np.float64) if kind == "sparse" else DenseStore(N_KEYS, COLS, 7, "f8")
    all_keys, w0, touched, ref = _run(store, name, params)
    got = store.gather(all_keys)
    want = np.array([ref.w[k] for k in all_keys.tolist()])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
    untouched = np.array([k not in touched for k in all_keys.tolist()])
    assert untouched[-5:].all()  # the last keys are never pushed ...
    assert np.array_equal(got[untouched], w0[untouched])  # ... and stay bit-identical
    for slot in opt_slots(name):
        state = store.gather(all_keys[untouched], slot)
        fill = params.get("initial_accumulator", 0.0) if slot == "acc" else 0.0
        assert np.all(state == fill)


def opt_slots(name):
    return make_optimizer(name, {"lr": 1.0} if name != "ftrl" else {"alpha": 1.0}).slots


def test_sgd_is_exact():
    store = SparseStore(2, np.float64)
    opt = make_optimizer("sgd", {"lr": 0.5})
    rows = store.locate(np.array([10, 20]), create=True)
    opt.step(store, rows, np.array([[1.0, 2.0], [4.0, -8.0]]))
    opt.step(store, rows[:1], np.array([[1.0, 1.0]]))
    assert store.gather(np.array([10, 20])).tolist() == [[-1.0, -1.5], [-2.0, 4.0]]


def test_adam_step_count_is_per_row():
    store = SparseStore(1, np.float64)
    opt = make_optimizer("adam", {"lr": 0.1})
    opt.attach(store)
    a = store.locate(np.array([1]), create=True)
    for _ in range(5):
        opt.step(store, a, np.array([[1.0]]))
    b = store.locate(np.array([2]), create=True)
    opt.step(store, b, np.array([[1.0]]))
    # a fresh row's first bias-corrected Adam step is lr * sign(g), whatever others did
    assert store.gather(np.array([2]))[0, 0] == pytest.approx(-0.1, rel=1e-6)
    assert store.gather(np.array([1, 2]), "t").tolist() == [[5.0], [1.0]]
    assert store.slot("t").shape[1] == 1 and store.slot("t").dtype == np.float64


def test_ftrl_l1_gives_exact_zeros():
    store = SparseStore(4, np.float64)
    opt = make_optimizer("ftrl", {"alpha": 0.1, "l1": 1.0})
    opt.attach(store)
    rows = store.locate(np.array([3, 4]), create=True)
    opt.step(store, rows, np.array([[0.5, -0.5, 2.0, -3.0], [0.0, 0.1, 0.2, 0.3]]))
    w = store.gather(np.array([3, 4]))
    assert w[0, :2].tolist() == [0.0, 0.0] and np.all(w[1] == 0.0)
    assert w[0, 2] < 0 < w[0, 3]


def test_float32_store_tracks_float64():
    s32, s64 = SparseStore(COLS, np.float32), SparseStore(COLS, np.float64)
    k32, _, _, _ = _run(s32, "adam", {"lr": 0.01})
    k64, _, _, _ = _run(s64, "adam", {"lr": 0.01})
    assert s32.slot("w").dtype == np.float32 and s32.slot("m").dtype == np.float32
    np.testing.assert_allclose(s32.gather(k32), s64.gather(k64), rtol=1e-4, atol=1e-5)


def test_step_rejects_bad_shapes():
    store = SparseStore(2, np.float64)
    opt = make_optimizer("sgd", {"lr": 0.1})
    rows = store.locate(np.array([1, 2]), create=True)
    with pytest.raises(ValueError, match=r"sgd.step: grads must have shape \(2, 2\), got \(2, 3\)"):
        opt.step(store, rows, np.zeros((2, 3)))
    with pytest.raises(ValueError, match=r"row ids must be >= 0 \(got -1\)"):
        opt.step(store, np.array([-1, 0]), np.zeros((2, 2)))
    opt.step(store, np.empty(0, dtype=np.int64), np.zeros((0, 2)))  # no-op
    vec = SparseStore(1, np.float64)
    r = vec.locate(np.array([4, 5]), create=True)
    opt.step(vec, r, np.array([1.0, 2.0]))  # [n] grads accepted for one column
    assert vec.gather(np.array([4, 5]))[:, 0].tolist() == [-0.1, -0.2]


@pytest.mark.parametrize(
    "name,params,match",
    [
        ("sgd", {"lr": 0.0}, "sgd: parameter lr must be > 0, got 0.0"),
        ("sgd", {"lr": -1}, "sgd: parameter lr must be > 0, got -1.0"),
        ("sgd", {}, "sgd: missing required parameter 'lr'"),
        ("sgd", {"lr": float("nan")}, "sgd: parameter lr must be finite, got nan"),
        ("sgd", {"lr": "fast"}, "sgd: parameter lr must be a number, got 'fast'"),
        ("sgd", {"lr": 0.1, "momentum": 0.9}, r"sgd: unknown parameter\(s\) \['momentum'\]"),
        ("momentum", {"lr": 0.1, "momentum": 1.0}, r"momentum must be in \[0, 1\), got 1.0"),
        ("adagrad", {"lr": 0.1, "eps": 0.0}, "adagrad: parameter eps must be > 0, got 0.0"),
        ("adagrad", {"lr": 0.1, "initial_accumulator": -1}, "initial_accumulator must be >= 0"),
        ("adam", {"lr": 0.1, "beta2": 1.5}, r"adam: parameter beta2 must be in \[0, 1\), got 1.5"),
        ("adam", {"lr": 0.1, "beta1": -0.1}, r"beta1 must be in \[0, 1\), got -0.1"),
        ("ftrl", {"alpha": 0.0}, "ftrl: parameter alpha must be > 0, got 0.0"),
        ("ftrl", {"alpha": 0.1, "l1": -0.5}, "ftrl: parameter l1 must be >= 0, got -0.5"),
        ("ftrl", {"alpha": 0.1, "beta": -1}, "ftrl: parameter beta must be >= 0, got -1.0"),
        ("ftrl", {"lr": 0.1}, r"unknown parameter\(s\) \['lr'\]; known: \['alpha'"),
        ("rmsprop", {"lr": 0.1}, r"unknown optimizer 'rmsprop'; known: \['sgd', 'momentum'"),
    ],
)
def test_param_validation(name, params, match):
    with pytest.raises(ValueError, match=match):
        make_optimizer(name, params)


def test_registry_and_attach_is_idempotent():
    assert OPTIMIZERS == ("sgd", "momentum", "adagrad", "adam", "adamw", "ftrl")
    store = DenseStore(3, 1, 0, "f8")
    opt = make_optimizer("adagrad", {"lr": 1.0, "initial_accumulator": 2.0})
    opt.attach(store)
    store.slot("acc")[0] = 9.0
    opt.attach(store)  # re-attaching (e.g. after restore) keeps the state
    assert store.slot("acc")[:, 0].tolist() == [9.0, 2.0, 2.0]
    assert opt.params == {"lr": 1.0, "eps": 1e-8, "initial_accumulator": 2.0}
    assert "AdaGrad(lr=1.0" in repr(opt)
