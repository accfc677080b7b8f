"""Tests for the learned cost models (ansor.costmodel) on synthetic features, and for the model
shipped in the package."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest

from ansor.costmodel.metrics import evaluate_split, pairwise_accuracy, r2_score, topk_recall
from ansor.costmodel.model import RandomModel, XGBModel, is_failed_cost, normalized_throughputs
from ansor.target import Target

F = 164
_W = np.random.default_rng(1234).normal(size=8)


def _programs(n: int, seed: int, max_rows: int = 6) -> list[np.ndarray]:
    """Random per-row features, log-transformed like the real extractor's output."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, max_rows + 1, size=n)
    return [np.log2(1.0 + rng.exponential(4.0, size=(int(r), F))).astype(np.float32) for r in sizes]


def _speed(x: np.ndarray) -> float:
    """Hidden throughput: a nonlinear per-row term summed over rows, as the pack-sum assumes."""
    return float(np.sum(1.5 + np.tanh(x[:, :8] @ _W / 4.0) + 0.3 * x[:, 8:12].sum(axis=1)))


def _dataset(n: int, seed: int, scale: float = 1.0) -> tuple[list[np.ndarray], list[float]]:
    feats = _programs(n, seed)
    return feats, [scale / _speed(x) for x in feats]


def _model(**kw) -> XGBModel:
    return XGBModel(**{"num_warmup_sample": 0, "n_threads": 1, **kw})


@pytest.fixture(scope="module")
def trained() -> tuple[XGBModel, list[np.ndarray], list[float]]:
    """A model fit on 600 programs plus 200 held-out programs with their true costs."""
    train_f, train_c = _dataset(600, seed=0)
    model = XGBModel(num_warmup_sample=100, n_threads=1)
    model.update(train_f, train_c, ["t"] * len(train_c))
    test_f, test_c = _dataset(200, seed=1)
    return model, test_f, test_c


# ------------------------------------------------------------------ learning


def test_learns_ranking_on_held_out_programs(trained):
    model, test_f, test_c = trained
    pred = model.predict(test_f)
    true = 1.0 / np.asarray(test_c)
    assert pred.shape == (200,) and np.all(np.isfinite(pred))
    assert pairwise_accuracy(pred, true) > 0.8
    assert model.last_fit_info["programs"] == 600
    assert 0 < model.last_fit_info["rounds"] <= model.max_rounds


def test_random_model_ranks_at_chance(trained):
    _, test_f, test_c = trained
    pred = RandomModel(seed=0).predict(test_f)
    assert pred.shape == (200,) and np.all((pred >= 0) & (pred < 1))
    assert abs(pairwise_accuracy(pred, 1.0 / np.asarray(test_c)) - 0.5) < 0.1


def test_prediction_is_pack_sum_of_rows(trained):
    model, test_f, _ = trained
    x = test_f[0]
    single, double = model.predict([x, np.concatenate([x, x])])
    assert double == pytest.approx(2.0 * single, rel=1e-5)
    rows = model.booster.inplace_predict(x)
    assert single == pytest.approx(float(np.sum(rows)), rel=1e-5)


def test_training_data_accumulate_across_updates():
    f, c = _dataset(160, seed=2)
    model = _model()
    model.update(f[:80], c[:80], ["t"] * 80)
    assert model.last_fit_info["programs"] == 80
    model.update(f[80:], c[80:], ["t"] * 80)
    assert model.num_records == 160 and model.last_fit_info["programs"] == 160


def test_adaptive_training_skips_small_updates():
    f, c = _dataset(260, seed=3)
    model = _model(adaptive_training=True)
    model.update(f[:200], c[:200], ["t"] * 200)
    first = model.booster
    model.update(f[200:220], c[200:220], ["t"] * 20)  # +10 %: keep the current booster
    assert model.booster is first
    model.update(f[220:], c[220:], ["t"] * 40)  # +30 % since the last fit: refit
    assert model.booster is not first and model.last_fit_info["programs"] == 260


# ------------------------------------------------------------------ warm-up, failures, groups


def test_warmup_returns_random_scores_until_enough_programs():
    f, c = _dataset(130, seed=4)
    model = XGBModel(num_warmup_sample=100, n_threads=1)
    model.update(f[:99], c[:99], ["t"] * 99)
    assert model.booster is None
    a, b = model.predict(f[:50]), model.predict(f[:50])
    assert np.all((a >= 0) & (a < 1)) and not np.array_equal(a, b)
    model.update(f[99:], c[99:], ["t"] * 31)  # 130 >= 100: the model takes over
    assert model.booster is not None
    np.testing.assert_array_equal(model.predict(f[:50]), model.predict(f[:50]))


def test_failed_programs_get_zero_label_and_do_not_break_training():
    f, c = _dataset(500, seed=5)
    c = list(c)
    for i in range(0, 500, 7):
        c[i] = math.inf if i % 2 else 1e10
    y = normalized_throughputs(c, ["t"] * 500)
    failed = np.array([is_failed_cost(x) for x in c])
    assert failed.sum() == len(range(0, 500, 7))
    assert np.all(y[failed] == 0) and np.all((y[~failed] > 0) & (y[~failed] <= 1)) and y.max() == 1.0

    model = _model()
    model.update(f, c, ["t"] * 500)
    test_f, test_c = _dataset(200, seed=6)
    pred = model.predict(test_f)
    assert np.all(np.isfinite(pred))
    assert pairwise_accuracy(pred, 1.0 / np.asarray(test_c)) > 0.75


def test_recognizable_failures_are_predicted_slow():
    """The weight floor keeps zero-label programs in the fit, so a feature that marks failures is learned."""
    f, c = _dataset(500, seed=17)
    for i in range(0, 500, 5):
        f[i] = f[i].copy()
        f[i][:, 100] = 20.0
        c[i] = math.inf
    model = _model()
    model.update(f, c, ["t"] * 500)
    ok = _programs(100, seed=18)
    bad = [x.copy() for x in ok]
    for x in bad:
        x[:, 100] = 20.0
    assert model.predict(bad).mean() < 0.2 * model.predict(ok).mean()


def test_all_failed_group_has_zero_labels():
    y = normalized_throughputs([math.inf, 1e10, float("nan"), 0.0, 2.0], ["a", "a", "a", "a", "b"])
    np.testing.assert_array_equal(y, [0, 0, 0, 0, 1])


def test_per_group_normalization_lets_both_groups_learn():
    fa, ca = _dataset(400, seed=7, scale=1.0)
    fb, cb = _dataset(400, seed=8, scale=10.0)  # the same law, 10x slower
    ya = normalized_throughputs(ca, ["a"] * 400)
    yb = normalized_throughputs(cb, ["b"] * 400)
    both = normalized_throughputs(ca + cb, ["a"] * 400 + ["b"] * 400)
    np.testing.assert_allclose(both, np.concatenate([ya, yb]))
    assert ya.max() == yb.max() == 1.0 and abs(ya.mean() - yb.mean()) < 0.1  # one scale despite 10x costs

    model = _model()
    model.update(fa + fb, ca + cb, ["a"] * 400 + ["b"] * 400)
    for seed, scale in ((9, 1.0), (10, 10.0)):
        test_f, test_c = _dataset(150, seed=seed, scale=scale)
        assert pairwise_accuracy(model.predict(test_f), 1.0 / np.asarray(test_c)) > 0.8


def test_programs_without_features_score_minus_inf(trained):
    model, test_f, _ = trained
    empty, zeros = np.zeros((0, F), np.float32), np.zeros((3, F), np.float32)
    pred = model.predict([test_f[0], empty, zeros, np.zeros(0)])
    assert np.isfinite(pred[0]) and np.all(pred[1:] == -np.inf)
    assert np.all(model.predict([empty, empty]) == -np.inf)
    warm = XGBModel(num_warmup_sample=100)
    assert warm.predict([test_f[0], empty])[1] == -np.inf


def test_programs_without_features_are_skipped_in_training():
    f, c = _dataset(100, seed=11)
    f = [np.zeros((0, F), np.float32) if i % 10 == 0 else x for i, x in enumerate(f)]
    model = _model()
    model.update(f, c, ["t"] * 100)
    assert model.num_records == 100 and model.last_fit_info["programs"] == 90


def test_input_validation(trained):
    model, test_f, _ = trained
    with pytest.raises(ValueError):
        model.update(test_f[:2], [1.0], ["t", "t"])
    with pytest.raises(ValueError):
        model.predict([np.ones((2, F + 1), np.float32)])


# ------------------------------------------------------------------ persistence


def test_save_load_round_trip(trained, tmp_path):
    model, test_f, _ = trained
    path = tmp_path / "model.json"
    model.save(path)
    meta = json.loads(path.read_text())
    assert meta["format"] == "ansor.costmodel.XGBModel" and isinstance(meta["booster"], str)

    loaded = XGBModel.load(path, n_threads=1)
    assert loaded.num_records == 0 < loaded.num_warmup_sample  # trusted despite no local data
    np.testing.assert_array_equal(loaded.predict(test_f), model.predict(test_f))

    # The loaded booster is kept until local data pass the warm-up size.
    f, c = _dataset(20, seed=12)
    loaded.num_warmup_sample = 100
    loaded.update(f, c, ["t"] * 20)
    np.testing.assert_array_equal(loaded.predict(test_f), model.predict(test_f))


def test_save_before_training_loads_an_untrained_model(tmp_path):
    path = tmp_path / "m.json"
    XGBModel(num_warmup_sample=7, seed=5).save(path)
    loaded = XGBModel.load(path)
    assert loaded.booster is None and loaded.num_warmup_sample == 7 and loaded.seed == 5
    pred = loaded.predict(_programs(5, seed=13))
    assert np.all((pred >= 0) & (pred < 1))


def test_load_rejects_foreign_files(tmp_path):
    path = tmp_path / "other.json"
    path.write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(ValueError):
        XGBModel.load(path)


# ------------------------------------------------------------------ population


def test_predicting_a_population_gives_one_finite_score_each(trained):
    model, _, _ = trained
    population = _programs(2048, seed=14, max_rows=7)
    pred = model.predict(population)
    assert pred.shape == (2048,)
    assert np.isfinite(pred).all()


# ------------------------------------------------------------------ metrics


def test_pairwise_accuracy_examples():
    assert pairwise_accuracy([1, 2, 3], [10, 20, 30]) == 1.0
    assert pairwise_accuracy([3, 2, 1], [10, 20, 30]) == 0.0
    assert pairwise_accuracy([1, 3, 2], [10, 20, 30]) == pytest.approx(2 / 3)
    assert pairwise_accuracy([1, 2, 3], [5, 5, 9]) == 1.0  # the tied pair is ignored
    assert pairwise_accuracy([7, 7], [1, 2]) == 0.5  # a tie in the prediction is half right
    assert math.isnan(pairwise_accuracy([1, 2], [3, 3]))
    # Across groups nothing is compared: only (0,1) in "a" and (2,3) in "b".
    assert pairwise_accuracy([1, 2, 9, 0], [1, 2, 3, 4], groups=["a", "a", "b", "b"]) == 0.5


def test_pairwise_accuracy_with_a_margin_ignores_pairs_within_the_noise():
    true = [1.00, 1.02, 2.0, 4.0]  # the first two are within 5% of each other
    pred = [2.0, 1.0, 3.0, 4.0]    # ... and only their order is wrong
    assert pairwise_accuracy(pred, true) == pytest.approx(5 / 6)
    assert pairwise_accuracy(pred, true, margin=0.05) == 1.0
    assert pairwise_accuracy(pred, true, margin=10.0) != pairwise_accuracy(pred, true, margin=10.0)  # no pair: NaN
    from ansor.costmodel.metrics import _share_of_close_pairs
    assert _share_of_close_pairs(np.array(true), ["a"] * 4, 0.05) == pytest.approx(1 / 6)
    assert _share_of_close_pairs(np.array(true), ["a", "b", "a", "b"], 0.05) == 0.0  # the close pair spans groups


def test_pairwise_accuracy_matches_brute_force_on_large_input():
    rng = np.random.default_rng(15)
    p, t = rng.integers(0, 20, 700).astype(float), rng.integers(0, 20, 700).astype(float)
    right = total = 0.0
    for i in range(700):
        m = t[i] > t
        total += m.sum()
        right += (m & (p[i] > p)).sum() + 0.5 * (m & (p[i] == p)).sum()
    assert pairwise_accuracy(p, t) == pytest.approx(right / total)


def test_topk_recall_examples():
    true = [0.1, 0.9, 0.8, 0.2, 0.7]
    assert topk_recall([0.0, 1.0, 0.9, 0.1, 0.8], true, 3) == 1.0
    assert topk_recall([1.0, 0.0, 0.0, 0.9, 0.8], true, 3) == pytest.approx(1 / 3)
    assert topk_recall([5, 4, 3, 2, 1], true, 1) == 0.0
    assert topk_recall([1, 2], [1, 2], 10) == 1.0  # k clipped to the number of programs


def test_r2_score_examples():
    assert r2_score([1, 2, 3], [1, 2, 3]) == 1.0
    assert r2_score([2, 2, 2], [1, 2, 3]) == 0.0
    assert r2_score([3, 2, 1], [1, 2, 3]) == pytest.approx(-3.0)
    assert r2_score([1, 1], [1, 1]) == 1.0 and r2_score([0, 1], [1, 1]) == 0.0


def test_evaluate_split_reports_held_out_metrics():
    f, c = _dataset(300, seed=16)
    groups = ["a" if i % 2 else "b" for i in range(300)]
    c = [x * (10 if g == "b" else 1) for x, g in zip(c, groups)]
    f[0] = np.zeros((0, F), np.float32)
    res = evaluate_split(f, c, groups, test_fraction=0.2, seed=0, k=5, model_kwargs={"n_threads": 1})
    assert res["n_unusable"] == 1 and res["n_test"] == 60 and res["n_train"] == 239 and res["n_groups"] == 2
    assert res["pairwise_accuracy"] > 0.75 and res["r2"] > 0.5 and 0.0 <= res["topk_recall"] <= 1.0
    assert res["pairwise_accuracy_beyond_5pct"] >= res["pairwise_accuracy"] - 0.05
    assert 0.0 <= res["pairs_within_5pct"] < 0.5
    again = evaluate_split(f, c, groups, test_fraction=0.2, seed=0, k=5, model_kwargs={"n_threads": 1})
    assert again["pairwise_accuracy"] == res["pairwise_accuracy"] and again["r2"] == res["r2"]  # seeded split


def test_prior_programs_of_other_tasks_train_the_model_before_any_own_data():
    """Programs of other tasks (a hidden speed law shared by all tasks, each on its own scale)
    let a model rank a new task's programs with no warm-up, and stay in every later fit."""
    prior_f, prior_c, prior_g = [], [], []
    for t, scale in enumerate((1.0, 30.0, 0.01)):
        f, c = _dataset(200, seed=10 + t, scale=scale)
        prior_f += f
        prior_c += c
        prior_g += [f"task{t}"] * len(c)
    model = XGBModel(num_warmup_sample=100, n_threads=1)
    model.set_prior(prior_f, prior_c, prior_g)
    assert model.num_prior == 600 and model.num_records == 0
    test_f, test_c = _dataset(200, seed=20, scale=5.0)
    pred = model.predict(test_f)
    assert pairwise_accuracy(pred, 1.0 / np.asarray(test_c)) > 0.75
    own_f, own_c = _dataset(10, seed=21, scale=5.0)
    model.update(own_f, own_c, ["new"] * 10)  # inside warm-up: with a prior it refits anyway
    assert model.last_fit_info["programs"] == 610
    with pytest.raises(ValueError):
        model.set_prior(prior_f[:2], prior_c[:3], prior_g[:2])


# ------------------------------------------------------------------ a pretrained base


def test_a_base_scores_at_once_and_fits_continue_from_it(trained):
    """A model with a base (the package's pretrained trees) ranks before it has seen any program
    of its task, and its first fit adds trees to the base's instead of starting over."""
    base, test_f, test_c = trained
    model = XGBModel(n_threads=1, base=base.booster)
    assert model.trusted and model.pretrained and not _model().pretrained
    np.testing.assert_allclose(model.predict(test_f), base.predict(test_f), rtol=1e-6)
    new_f, new_c = _dataset(20, seed=7)
    model.update(new_f, new_c, ["u"] * 20)  # 20 programs, far below the warm-up: a fit anyway
    assert model.booster is not None
    assert model.booster.num_boosted_rounds() > base.booster.num_boosted_rounds()
    assert model.last_fit_info["rounds"] == model.booster.num_boosted_rounds()
    assert 0 <= model.last_fit_info["train_p_rmse"] < 1
    assert pairwise_accuracy(model.predict(test_f), 1.0 / np.asarray(test_c)) > 0.8


def test_a_few_programs_add_few_trees_to_a_base_and_a_full_batch_is_uncapped(trained):
    """On a task's first programs a continued fit may add one tree per PROGRAMS_PER_NEW_TREE
    of them (a few noisy timings must not outvote the base's ranking); from
    CAPPED_FIT_PROGRAMS on, as many as the training error asks for."""
    from ansor.costmodel.model import CAPPED_FIT_PROGRAMS, PROGRAMS_PER_NEW_TREE

    base, _, _ = trained
    base_rounds = base.booster.num_boosted_rounds()
    model = XGBModel(n_threads=1, base=base.booster)
    feats, base_order_costs = _dataset(CAPPED_FIT_PROGRAMS, seed=9)
    costs = [1.0 / c for c in base_order_costs]  # a task the base ranks backwards: fits want many trees
    model.update(feats[:12], costs[:12], ["u"] * 12)
    assert 1 <= model.booster.num_boosted_rounds() - base_rounds <= 12 // PROGRAMS_PER_NEW_TREE
    model.update(feats[12:], costs[12:], ["u"] * (CAPPED_FIT_PROGRAMS - 12))
    assert model.booster.num_boosted_rounds() - base_rounds > CAPPED_FIT_PROGRAMS // PROGRAMS_PER_NEW_TREE


# ------------------------------------------------------------------ the shipped model


@pytest.fixture
def fresh_pretrained(monkeypatch):
    """The pretrained module with no model parsed yet and no target warned about in this test."""
    from ansor.costmodel import pretrained

    pretrained._shipped_booster.cache_clear()
    monkeypatch.setattr(pretrained, "_warned_targets", set())
    yield pretrained
    pretrained._shipped_booster.cache_clear()


def _like_the_training_machines() -> Target:
    """A CPU target with the ISA and core count the shipped model was trained on."""
    from ansor.costmodel.pretrained import provenance

    isa, cores = provenance()["target"].rsplit("-", 2)[1:]
    return Target("cpu", isa, int(cores.rstrip("c")), 64, 64)


def test_pretrained_model_loads_from_the_package_directory(trained, tmp_path, monkeypatch, fresh_pretrained):
    import ansor

    pretrained = fresh_pretrained
    monkeypatch.setattr(pretrained, "PRETRAINED_DIR", tmp_path)
    target = ansor.Target.host()
    assert pretrained.load_pretrained(target) is None  # no model for this kind: None, no error
    base, test_f, _ = trained
    pretrained.save_pretrained(base, {"programs": 600, "continued_from": {"programs": 5, "fingerprint": {}}})
    info = pretrained.provenance()
    assert info["programs"] == 600 and info["continued_from"] == {"programs": 5}  # only its own fingerprint
    assert info["fingerprint"]["probe_rows"] == len(info["fingerprint"]["probe_predictions"]) > 0
    loaded = pretrained.load_pretrained(target)
    assert loaded is not None and loaded.pretrained and loaded.booster is None
    np.testing.assert_allclose(loaded.predict(test_f), base.predict(test_f), rtol=1e-6)
    (tmp_path / "cpu.model.json").write_text("{not json")
    with pytest.warns(pretrained.PretrainedModelWarning, match="does not load"):
        assert pretrained.load_pretrained(target) is None  # damaged: said, and tuning goes on without


def test_the_shipped_model_is_used_only_while_it_reproduces_its_fingerprint(tmp_path, monkeypatch,
                                                                             fresh_pretrained):
    """The package's model file, loaded for real: it predicts its probe rows as its provenance
    says. A probe that no longer matches (another xgboost reading the trees otherwise), a
    provenance of other features, a missing fingerprint or a damaged file each say why and
    leave the model out."""
    from ansor.costmodel.fingerprint import mismatch

    pretrained = fresh_pretrained
    monkeypatch.setenv(pretrained.ENV_SWITCH, "1")  # tests start with the shipped model off
    assert pretrained.enabled_by_default()
    target = _like_the_training_machines()
    with warnings.catch_warnings():
        warnings.simplefilter("error", pretrained.PretrainedModelWarning)
        shipped = pretrained.load_pretrained(target)
    assert shipped is not None and shipped.pretrained
    assert mismatch(shipped.base, pretrained.provenance()["fingerprint"]) is None

    info = pretrained.provenance()
    real_model = pretrained.model_file()
    (tmp_path / "cpu.model.json").symlink_to(real_model)
    monkeypatch.setattr(pretrained, "PRETRAINED_DIR", tmp_path)

    def load_with(provenance: dict) -> object:
        pretrained.provenance_file().write_text(json.dumps(provenance))
        return pretrained.load_pretrained(target)

    shifted = [p + 0.5 for p in info["fingerprint"]["probe_predictions"]]  # base_score read otherwise
    with pytest.warns(pretrained.PretrainedModelWarning, match=r"xgboost .*probe rows differently"):
        assert load_with(info | {"fingerprint": info["fingerprint"] | {"probe_predictions": shifted}}) is None
    with pytest.warns(pretrained.PretrainedModelWarning, match="another feature schema"):
        assert load_with(info | {"fingerprint": info["fingerprint"] | {"feature_schema": "sha256:0"}}) is None
    with pytest.warns(pretrained.PretrainedModelWarning, match="no fingerprint"):
        assert load_with({k: v for k, v in info.items() if k != "fingerprint"}) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error", pretrained.PretrainedModelWarning)
        assert load_with(info) is not None  # the provenance as shipped: used again

    (tmp_path / "cpu.model.json").unlink()
    (tmp_path / "cpu.model.json").write_bytes(real_model.read_bytes()[:100_000])  # a cut-off download
    with pytest.warns(pretrained.PretrainedModelWarning, match=r"cpu\.model\.json not used .*does not load"):
        assert pretrained.load_pretrained(target) is None


def test_write_fingerprint_brings_the_provenance_in_line_with_the_model(trained, tmp_path, monkeypatch,
                                                                       fresh_pretrained):
    pretrained = fresh_pretrained
    monkeypatch.setattr(pretrained, "PRETRAINED_DIR", tmp_path)
    base, _, _ = trained
    pretrained.save_pretrained(base, {"programs": 600})
    info = pretrained.provenance()
    info["fingerprint"]["probe_predictions"][0] += 1.0
    pretrained.provenance_file().write_text(json.dumps(info))
    assert pretrained.main([]) == 1  # the check says the model no longer matches
    assert pretrained.main(["--write-fingerprint"]) == 0
    assert pretrained.main([]) == 0
    assert pretrained.provenance()["programs"] == 600  # the rest of the provenance is kept


def test_a_target_unlike_the_training_machines_is_said_once_and_the_model_still_used(fresh_pretrained):
    pretrained = fresh_pretrained
    trained_on = _like_the_training_machines()
    other = Target("cpu", "avx2" if trained_on.isa != "avx2" else "generic", trained_on.num_cores + 6, 32, 64)
    with pytest.warns(pretrained.PretrainedModelWarning, match="another ISA or core count"):
        assert pretrained.load_pretrained(other) is not None
    with warnings.catch_warnings():
        warnings.simplefilter("error", pretrained.PretrainedModelWarning)
        assert pretrained.load_pretrained(other) is not None  # said once
        assert pretrained.load_pretrained(trained_on) is not None  # a training machine: nothing to say


def test_feature_schema_hash_follows_names_and_their_order():
    from ansor.costmodel.features import FEATURE_NAMES
    from ansor.costmodel.fingerprint import feature_schema_hash

    assert feature_schema_hash(FEATURE_NAMES) == feature_schema_hash()
    swapped = (FEATURE_NAMES[1], FEATURE_NAMES[0], *FEATURE_NAMES[2:])
    assert feature_schema_hash(swapped) != feature_schema_hash()
    assert feature_schema_hash(FEATURE_NAMES[:-1]) != feature_schema_hash()


def test_probe_rows_are_fixed_and_look_like_features():
    """The probe rows are part of every stored fingerprint: they must come out the same in every
    process and numpy version (a fixed integer hash, not numpy's generators)."""
    from ansor.costmodel.fingerprint import probe_rows

    rows = probe_rows()
    assert rows.shape == (16, F) and rows.dtype == np.float32
    assert not rows[0].any() and rows[1:].any(axis=1).all()
    assert 0.2 < float(np.mean(rows == 0)) < 0.5 and rows.max() <= 24.0
    np.testing.assert_array_equal(rows, probe_rows())
    np.testing.assert_allclose(rows[1, :3], [9.529005, 5.2896056, 14.009501], rtol=1e-6)
