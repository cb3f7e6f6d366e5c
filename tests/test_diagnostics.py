"""Diversity metrics by hand, decomposition identities, collusion checks, team selection, seed 000."""

import json

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import run_cli
from hypothesis import given, settings
from hypothesis import strategies as st
from seed000 import seed000_members

from consistency_gate.diagnostics import decomposition as dec
from consistency_gate.diagnostics.diagnose import collusion_warnings, diagnose
from consistency_gate.diagnostics.diversity import pairwise_values, ranking_score, team_diversity
from consistency_gate.diagnostics.selection import Pool, select_teams
from consistency_gate.errors import UsageError

ORACLE = np.array(
    [
        [1, 1, 1, 0, 0, 1],
        [1, 0, 1, 1, 0, 1],
        [0, 1, 1, 1, 0, 1],
    ],
    dtype=bool,
)


def test_q_metrics_by_hand():
    # negatives: samples 0, 1, 3, 4; every pair has N11 = N10 = N01 = N00 = 1 there
    d = team_diversity(ORACLE)
    assert d["ck"] == pytest.approx(0.0) and d["qs"] == pytest.approx(0.0) and d["bd"] == pytest.approx(0.5)
    # l(x) on negatives = 2, 2, 2, 0; p_bar = 0.5; sum l(S - l) = 6
    assert d["fk"] == pytest.approx(1 - (6 / 3) / (4 * 2 * 0.25))
    assert d["kw"] == pytest.approx(6 / (4 * 9))
    assert d["gd"] == pytest.approx(1 - 0.25 / 0.5)
    v = pairwise_values(*(np.float64(x) for x in (3, 1, 2, 4)))  # N11, N10, N01, N00
    assert v["ck"] == pytest.approx(2 * (12 - 2) / (4 * 6 + 5 * 5))
    assert v["qs"] == pytest.approx(10 / 14)
    assert v["bd"] == pytest.approx(3 / 10)
    assert ranking_score("bd", 0.3) == pytest.approx(0.7) and ranking_score("ck", 0.3) == 0.3


def test_all_members_perfect_gives_null_with_reason():
    y = np.array([0, 1, 1])
    probs = np.array([np.eye(2)[y] * 0.8 + 0.1] * 2)
    report = diagnose(["a", "b"], probs, y, ["0", "1"])
    assert all(v is None for v in report["diversity"].values())
    assert "no negative samples" in report["diversity_null_reasons"]["ck"]
    with pytest.raises(UsageError, match="at least two"):
        diagnose(["a"], probs[:1], y, ["0", "1"])


def _random_probs(seed, m=3, n=20, p=4):
    rng = np.random.default_rng(seed)
    z = rng.normal(0, 2, (m, n, p))
    return z, np.exp(z) / np.exp(z).sum(-1, keepdims=True), rng.integers(0, p, n)


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 5))
def test_decomposition_identities(seed, m):
    z, probs, y = _random_probs(seed, m=m)
    w = np.random.default_rng(seed).dirichlet(np.ones(m))
    losses = dec.losses(probs, y, w)
    assert losses["ce_members"] - losses["ce_ensemble"] == pytest.approx(dec.diversity_ce_probs(probs, y, w), abs=1e-9)
    assert losses["brier_members"] - losses["brier_ensemble"] == pytest.approx(dec.diversity_brier(probs, w), abs=1e-9)
    # score averaging: member CE minus CE of softmax(sum_j w_j z_j)
    zbar = np.tensordot(w, z, axes=1)
    log_q = zbar - np.log(np.exp(zbar).sum(-1, keepdims=True))
    ce_ens = -log_q[np.arange(len(y)), y].mean()
    ce_mem = np.tensordot(w, -np.log(probs[:, np.arange(len(y)), y]), axes=1).mean()
    assert ce_mem - ce_ens == pytest.approx(dec.diversity_ce_scores(z, w), abs=1e-9)
    assert dec.diversity_ce_probs(probs, y, w) >= -1e-12


def test_debiasing_and_codependence():
    _, probs, y = _random_probs(1)
    shifted = np.stack([probs[0], probs[0] + 0.1, probs[0] - 0.05])  # members differ by a constant only
    assert dec.debiasing_share(shifted) == pytest.approx(1.0)
    assert dec.debiasing_share(np.stack([probs[0]] * 2)) is None
    assert dec.codependence(np.stack([probs[0]] * 4), y) == pytest.approx(0.0)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 6), st.sampled_from([0.25, 0.5, 0.75]))
def test_codependence_is_the_mean_over_every_draw(seed, m, drop):
    """Reusing a draw's error rate changes nothing: the mean over ``draws`` subsets, each evaluated, by hand."""
    _, probs, y = _random_probs(seed, m=m)
    keep = max(1, round(m * (1 - drop)))
    rng = np.random.default_rng(7)
    drawn = [rng.choice(m, keep, replace=False) for _ in range(60)]
    by_hand = np.mean([np.mean(probs[d].mean(axis=0).argmax(axis=1) != y) for d in drawn])
    full = np.mean(probs.mean(axis=0).argmax(axis=1) != y)
    assert dec.codependence(probs, y, drop, draws=60, seed=7) == by_hand - full


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 5))
def test_collusion_numbers_invariants(seed, m):
    z, probs, y = _random_probs(seed, m=m)
    same = dec.collusion_numbers(np.stack([probs[0]] * m), y)
    assert same["div"] == pytest.approx(0.0, abs=1e-12) and same["div_share"] == pytest.approx(0.0, abs=1e-12)
    assert same["debiasing_share_logits"] is None  # no diversity, so no share of it
    offsets = np.random.default_rng(seed).normal(0, 1, (m, 1, z.shape[2]))  # one constant offset per member
    shifted = np.exp(z[:1] + offsets) / np.exp(z[:1] + offsets).sum(-1, keepdims=True)
    numbers = dec.collusion_numbers(shifted, y)
    assert numbers["debiasing_share_logits"] == pytest.approx(1.0)
    assert 0.0 <= numbers["div_share"] <= 1.0  # ensemble CE >= 0, so DIV <= mean member CE


def test_collusion_warnings_by_hand():
    evaluated = {"ce_members": 0.45, "div": 0.09, "div_share": 0.2, "debiasing_share_logits": 0.1}
    collusive_train = {"ce_members": 0.7, "div": 0.6, "div_share": 0.86, "debiasing_share_logits": 0.1}
    (warning,) = collusion_warnings(evaluated, collusive_train)
    assert "86% of the mean member loss" in warning and "20%" in warning
    assert collusion_warnings(evaluated) == []  # without the training set, only the bias check runs
    assert collusion_warnings({**evaluated, "div": 0.35}, collusive_train) == []  # more than half carries over
    assert collusion_warnings(evaluated, {**collusive_train, "div_share": 0.49}) == []
    fitted = {"ce_members": 0.02, "div": 0.012, "div_share": 0.6, "debiasing_share_logits": 0.1}
    assert collusion_warnings({**evaluated, "div": 0.005}, fitted) == []  # 0.012 nats: not material
    biased = {"ce_members": 1.0, "div": 0.3, "div_share": 0.3, "debiasing_share_logits": 0.6}
    assert "explains 60%" in collusion_warnings(biased)[0]
    copies = {"ce_members": 0.1, "div": 1e-4, "div_share": 1e-3, "debiasing_share_logits": 1.0}  # near-copies
    assert collusion_warnings(copies) == []


def test_augmented_loss():
    z, _, y = _random_probs(2)
    logits, target = torch.tensor(z), torch.tensor(y)
    independent = torch.stack([torch.nn.functional.cross_entropy(m, target) for m in logits]).mean()
    assert dec.augmented_loss(logits, target, 0.0).item() == pytest.approx(independent.item())
    ens = torch.softmax(logits, -1).mean(0)
    assert dec.augmented_loss(logits, target, 1.0).item() == pytest.approx(
        torch.nn.functional.nll_loss(torch.log(ens), target).item()
    )
    with pytest.raises(ValueError, match="Theorem 5.1"):
        dec.augmented_loss(logits, target, 1.5)


@pytest.mark.slow  # trains seed000's two members
def test_seed000_weaker_member_adds_almost_nothing():
    probs, y = seed000_members()
    report = diagnose(["A", "B"], probs, y, [str(i) for i in range(1000)])
    acc = {k: v["acc"] for k, v in report["members"].items()}
    assert acc["A"] == pytest.approx(0.356, abs=0.01) and acc["B"] == pytest.approx(0.2864, abs=0.02)
    assert abs(report["ensemble_acc"]["avg"] - acc["A"]) < 0.01  # neither degrades nor improves
    assert report["oracle_upper_bound"] - acc["A"] < 0.01
    assert report["disagreements"]["ensemble_follows"]["A"] > 0.8
    assert report["pairs"]["A|B"]["yule_q_all"] > 0.9
    text = " ".join(report["explanation"])
    assert "B can add at most" in text and "adds almost nothing" in text
    assert "follows A" in text and "more confident" in text


def test_team_selection_reports_004_layout():
    rng = np.random.default_rng(3)
    n, p, m = 400, 5, 6
    y = rng.integers(0, p, n)
    probs = []
    for i in range(m):
        z = rng.normal(0, 1, (n, p))
        z[np.arange(n), y] += 0.8 + 0.15 * i
        probs.append(np.exp(z) / np.exp(z).sum(1, keepdims=True))
    result = select_teams(Pool(np.array(probs), y))
    rows = {r["method"]: r for r in result["rows"]}
    assert rows["Baseline"]["teams_considered"] == 2**m - m - 1
    for metric in ("CK", "QS", "BD", "FK", "KW", "GD"):
        q, a, k = rows[f"Q-{metric}"], rows[f"HQ-{metric} (alpha)"], rows[f"HQ-{metric} (alpha+K)"]
        assert q["teams_selected"] < q["teams_considered"]
        assert a["teams_considered"] <= rows["Baseline"]["teams_considered"]
        assert k["teams_selected"] <= a["teams_selected"]
    best = result["best_single"]
    base = rows["Baseline"]
    assert base["above_best_single"] == pytest.approx(base["share_above_best_single"] * base["teams_selected"])
    assert best == pytest.approx(max((np.array(probs)[i].argmax(1) == y).mean() for i in range(m)))


def _write_members(tmp_path, probs, y, names):
    classes = [f"c{i}" for i in range(probs.shape[2])]
    pd.DataFrame({"id": range(len(y)), "label": np.array(classes)[y]}).to_csv(tmp_path / "labels.csv", index=False)
    for name, p in zip(names, probs, strict=True):
        pd.DataFrame(p, columns=classes).assign(id=range(len(y))).to_csv(tmp_path / f"{name}.csv", index=False)


def test_cli_diagnose_json_html_and_errors(tmp_path):
    rng = np.random.default_rng(0)
    y = rng.integers(0, 4, 300)
    probs = []
    for i in range(3):
        z = rng.normal(0, 1, (300, 4))
        z[np.arange(300), y] += 1 + i
        probs.append(np.exp(z) / np.exp(z).sum(1, keepdims=True))
    _write_members(tmp_path, np.array(probs), y, ["a", "b", "c"])
    args = ["diagnose", "--labels", tmp_path / "labels.csv", "--id-column", "id"]
    members = [x for name in "abc" for x in ("--member", f"{name}={tmp_path / (name + '.csv')}")]
    proc = run_cli(*args, *members, "--select", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert set(report["members"]) == {"a", "b", "c"} and set(report["diversity"]) == {
        "ck",
        "qs",
        "bd",
        "fk",
        "kw",
        "gd",
    }
    assert set(report["ensemble_acc"]) == {"mv", "wmv", "avg", "wavg"}
    assert report["pairs"]["a|b"]["table"]["both_right"] >= 0 and report["selection"]["rows"][0]["method"] == "Baseline"
    assert {"div_ce_probability_averaging", "div_brier", "debiasing_share", "codependence"} <= set(
        report["decomposition"]
    )
    html = run_cli(*args, *members[:4], "--format", "html")
    assert html.returncode == 0 and html.stdout.count("<img") == 3 and "Findings" in html.stdout
    table = run_cli(*args, *members[:4])
    assert table.returncode == 0 and "oracle bound" in table.stdout

    one = run_cli(*args, *members[:2])
    assert one.returncode == 2 and "at least two" in one.stderr
    big = run_cli(*args, *members, "--select", "--max-team-size", "5")
    assert big.returncode == 2 and "larger than the pool" in big.stderr
    pd.read_csv(tmp_path / "c.csv").iloc[:-1].to_csv(tmp_path / "short.csv", index=False)
    short = run_cli(*args, *members[:2], "--member", f"s={tmp_path / 'short.csv'}")
    assert short.returncode == 3 and "different sample sets" in short.stderr


def _pseudo_diverse(m: int, n: int, p: int) -> tuple[np.ndarray, np.ndarray]:
    """Member j is right (0.9) only on samples i with i % m == j and gives the true class 0.01 elsewhere:
    wrong apart, right together, as members trained jointly on the training set (Jeffares et al. 2023)."""
    y = np.arange(n) % p
    probs = np.full((m, n, p), 0.0)
    for j in range(m):
        mine = np.arange(n) % m == j
        true = np.where(mine, 0.9, 0.01)
        probs[j] = ((1 - true) / (p - 1))[:, None]
        probs[j][np.arange(n), y] = true
    return probs, y


def test_cli_diagnose_warns_of_collusion_from_training_predictions(tmp_path):
    rng = np.random.default_rng(1)
    y = rng.integers(0, 4, 200)
    z = rng.normal(0, 1, (3, 200, 4))
    z[:, np.arange(200), y] += 2.0
    (tmp_path / "test").mkdir()
    (tmp_path / "train").mkdir()
    _write_members(tmp_path / "test", np.exp(z) / np.exp(z).sum(-1, keepdims=True), y, ["a", "b", "c"])
    _write_members(tmp_path / "train", *_pseudo_diverse(3, 90, 4), ["a", "b", "c"])
    args = ["diagnose", "--labels", tmp_path / "test" / "labels.csv", "--id-column", "id", "--format", "json"]
    args += [x for name in "abc" for x in ("--member", f"{name}={tmp_path / 'test' / (name + '.csv')}")]
    train = [x for name in "abc" for x in ("--train-member", f"{name}={tmp_path / 'train' / (name + '.csv')}")]

    plain_run = run_cli(*args)
    assert plain_run.returncode == 0 and "collusion" not in plain_run.stderr
    report = json.loads(plain_run.stdout)
    assert report["collusion"]["train"] is None and "collusion.train" in report["null_reasons"]

    proc = run_cli(*args, *train, "--train-labels", tmp_path / "train" / "labels.csv")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    train_numbers, evaluated = report["collusion"]["train"], report["collusion"]["evaluated"]
    assert train_numbers["div_share"] > 0.5 and train_numbers["div"] > 2 * evaluated["div"]
    assert "learner collusion" in proc.stderr and report["explanation"][-1] == report["collusion"]["warnings"][0]

    no_labels = run_cli(*args, *train)
    assert no_labels.returncode == 2 and "--train-labels" in no_labels.stderr
    fewer = run_cli(*args, *train[:4], "--train-labels", tmp_path / "train" / "labels.csv")
    assert fewer.returncode == 2 and "same members" in fewer.stderr
    labels = pd.read_csv(tmp_path / "train" / "labels.csv")
    labels.assign(label=labels["label"].replace("c3", "c9")).to_csv(tmp_path / "odd.csv", index=False)
    odd = run_cli(*args, *train, "--train-labels", tmp_path / "odd.csv")
    assert odd.returncode == 3 and "odd.csv and the --train-member files) has class 'c9'" in odd.stderr


def test_team_selections_nest_and_match_the_table():
    """HQ (alpha+K) keeps a subset of HQ (alpha); the masks give the table's counts; the raw K-means
    (004's code) and the scaled one are both available."""
    from consistency_gate.diagnostics.selection import team_selections

    rng = np.random.default_rng(3)
    y = rng.integers(0, 4, 120)
    probs = rng.random((6, 120, 4)) + 0.9 * np.eye(4)[y][None] * rng.random((6, 1, 1))
    pool = Pool(probs, y)
    chosen = team_selections(pool, "qs")
    assert len(chosen.teams) == 2**6 - 6 - 1  # every team of 2..6 members
    assert not (chosen.masks["HQ (alpha+K)"] & ~chosen.masks["HQ (alpha)"]).any()
    rows = {r["method"]: r["teams_selected"] for r in select_teams(pool, metrics=("qs",))["rows"]}
    assert rows["Q-QS"] == chosen.masks["Q"].sum() and rows["HQ-QS (alpha+K)"] == chosen.masks["HQ (alpha+K)"].sum()
    raw = team_selections(pool, "qs", scale=False)
    assert (raw.masks["HQ (alpha)"] == chosen.masks["HQ (alpha)"]).all()  # scaling touches only K-means
    assert not (raw.masks["HQ (alpha+K)"] & ~raw.masks["HQ (alpha)"]).any()


def test_kmeans_on_raw_values_lets_the_wider_axis_decide():
    from consistency_gate.diagnostics.selection import kmeans_filter

    # scores spread over [0, 1], accuracies within 0.02: raw clustering splits on the score alone; scaled,
    # accuracy counts too, the 0.1-score team (among the least accurate) joins the weak cluster, and only
    # teams scoring below its lowest score (0.1) are kept
    scores = np.array([0.0, 0.1, 0.45, 0.9, 1.0])
    accuracy = np.array([0.90, 0.88, 0.885, 0.89, 0.88])
    assert kmeans_filter(scores, accuracy, scale=False).tolist() == [True, True, True, False, False]
    assert kmeans_filter(scores, accuracy).tolist() == [True, False, False, False, False]
