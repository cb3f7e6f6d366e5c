"""The numbers right to the letter (canonical class order, ties, diversity, messages).

The reference implementations here are written independently of the package: plain Python over
rows, sorting classes by (-score, label as text), the canonical order.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import run_cli, run_json
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from consistency_gate.core.evaluation import Evaluation
from consistency_gate.diagnostics.diagnose import diagnose, load_member_files
from consistency_gate.engines.local import compare_generations

# ---------------------------------------------------------------- an independent reference


def ref_top(scores: dict[str, float], k: int) -> list[str]:
    """The k best classes of one row: highest score first, ties to the label that sorts first."""
    return sorted(scores, key=lambda c: (-scores[c], c))[:k]


def ref_metrics(y: list[str], prev: list[dict], cand: list[dict], ks: tuple[int, ...]) -> dict[str, float]:
    n = len(y)
    a = [ref_top(r, 1)[0] for r in prev]
    b = [ref_top(r, 1)[0] for r in cand]
    ar = [ai == yi for ai, yi in zip(a, y, strict=True)]
    br = [bi == yi for bi, yi in zip(b, y, strict=True)]
    out = {
        "acc_previous": sum(ar) / n,
        "acc_candidate": sum(br) / n,
        "con": sum(ai == bi for ai, bi in zip(a, b, strict=True)) / n,
        "ctoc": sum(x and z for x, z in zip(ar, br, strict=True)) / n,
        "ctoi": sum(x and not z for x, z in zip(ar, br, strict=True)) / n,
        "itoc": sum(z and not x for x, z in zip(ar, br, strict=True)) / n,
        "itoi": sum(not x and not z for x, z in zip(ar, br, strict=True)) / n,
    }
    for k in ks:
        out[f"ccon@{k}"] = (
            sum(bool(set(ref_top(p, k)) & set(ref_top(c, k))) for p, c in zip(prev, cand, strict=True)) / n
        )
        out[f"cacc_previous@{k}"] = sum(yi in ref_top(p, k) for yi, p in zip(y, prev, strict=True)) / n
        out[f"cacc_candidate@{k}"] = sum(yi in ref_top(c, k) for yi, c in zip(y, cand, strict=True)) / n
    return out


# ---------------------------------------------------------------- strategies: heavy ties

LABELS = ["10", "2", "B", "a", "b", "cat", "Cat", "x1"]


@st.composite
def tied_problem(draw):
    p = draw(st.integers(2, 6))
    classes = draw(st.permutations(LABELS).map(lambda xs: xs[:p]))
    n = draw(st.integers(1, 25))
    level = st.sampled_from([0.0, 0.25, 0.5])  # three values only: ties on most rows
    prev = np.array(draw(st.lists(st.lists(level, min_size=p, max_size=p), min_size=n, max_size=n)))
    cand = np.array(draw(st.lists(st.lists(level, min_size=p, max_size=p), min_size=n, max_size=n)))
    y = draw(st.lists(st.sampled_from(classes), min_size=n, max_size=n))
    perm_a = draw(st.permutations(range(p)))
    perm_b = draw(st.permutations(range(p)))
    return classes, prev, cand, y, list(perm_a), list(perm_b)


def _evaluate(classes, prev, cand, y, ks) -> dict:
    ev = Evaluation(["previous", "candidate"], [list(classes[0]), list(classes[1])], ks=ks)
    ev.add(pd.Series(y), [pd.DataFrame(prev, columns=classes[0]), pd.DataFrame(cand, columns=classes[1])])
    return ev.result().metrics


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tied_problem())
def test_permuted_columns_never_change_a_metric_and_match_the_reference(problem):
    classes, prev, cand, y, perm_a, perm_b = problem
    ks = tuple(k for k in (1, 2, 3) if k <= len(classes))
    straight = _evaluate((classes, classes), prev, cand, y, ks)
    ca, cb = [classes[i] for i in perm_a], [classes[i] for i in perm_b]
    permuted = _evaluate((ca, cb), prev[:, perm_a], cand[:, perm_b], y, ks)
    assert permuted == pytest.approx(straight, nan_ok=True)
    rows_a = [dict(zip(classes, r, strict=True)) for r in prev]
    rows_b = [dict(zip(classes, r, strict=True)) for r in cand]
    reference = ref_metrics(y, rows_a, rows_b, ks)
    for key, value in reference.items():
        assert straight[key] == pytest.approx(value), key


def _write(path, frame):
    frame.to_csv(path, index=False)
    return path


def test_compare_cli_same_model_with_permuted_columns_is_fully_consistent(tmp_path):
    """The issue's case: one model written twice, the candidate's columns permuted, tied scores."""
    rng = np.random.default_rng(3)
    classes = ["ant", "bee", "cow", "dog"]
    n = 200
    scores = rng.choice([0.0, 0.5, 1.0], size=(n, 4))
    y = rng.choice(classes, n)
    labels = _write(tmp_path / "labels.csv", pd.DataFrame({"label": y}))
    prev = _write(tmp_path / "prev.csv", pd.DataFrame(scores, columns=classes))
    perm = [3, 1, 0, 2]
    cand = _write(tmp_path / "cand.csv", pd.DataFrame(scores[:, perm], columns=[classes[i] for i in perm]))
    out = run_json("compare", "--labels", labels, "--previous", prev, "--candidate", cand, "--format", "json")
    assert out["metrics"]["con"] == 1.0
    assert out["metrics"]["ctoi"] == 0.0 and out["metrics"]["itoc"] == 0.0
    assert out["metrics"]["ccon@1"] == 1.0
    assert out["classes"] == sorted(classes)


def test_generations_and_diagnose_ignore_column_order_and_break_ties_canonically(tmp_path):
    rng = np.random.default_rng(4)
    classes = ["b", "a", "c"]
    n = 120
    y = rng.choice(classes, n)
    labels = _write(tmp_path / "labels.csv", pd.DataFrame({"label": y}))
    gens = [rng.choice([0.0, 1.0], size=(n, 3)) for _ in range(3)]
    straight, permuted = {}, {}
    for g, scores in enumerate(gens):
        straight[f"g{g}"] = _write(tmp_path / f"g{g}.csv", pd.DataFrame(scores, columns=classes))
        perm = list(rng.permutation(3))
        permuted[f"g{g}"] = _write(
            tmp_path / f"p{g}.csv", pd.DataFrame(scores[:, perm], columns=[classes[i] for i in perm])
        )
    report_a = compare_generations(labels, straight)
    report_b = compare_generations(labels, permuted)
    assert report_a == report_b
    rows = [[dict(zip(classes, r, strict=True)) for r in s] for s in gens]
    ref = ref_metrics(list(y), rows[0], rows[1], (1,))
    assert report_a["pairs"]["g0|g1"]["con"] == pytest.approx(ref["con"])
    assert report_a["consecutive_flips"]["g0->g1"]["ctoi"] == pytest.approx(ref["ctoi"])
    assert report_a["unknown_labels"] == {"g0": 0, "g1": 0, "g2": 0}

    diag_a = diagnose(*load_member_files(labels, straight))
    diag_b = diagnose(*load_member_files(labels, permuted))
    assert json.dumps(diag_a, sort_keys=True) == json.dumps(diag_b, sort_keys=True)
    assert diag_a["pairs"]["g0|g1"]["con"] == pytest.approx(ref["con"])
    assert diag_a["members"]["g0"]["acc"] == pytest.approx(ref["acc_previous"])


def test_generations_reports_unknown_labels(tmp_path):
    labels = _write(tmp_path / "labels.csv", pd.DataFrame({"label": ["a", "b", "c", "c"]}))
    g1 = _write(tmp_path / "g1.csv", pd.DataFrame({"a": [1, 0, 0.5, 0.5], "b": [0, 1, 0.5, 0.5]}))
    g2 = _write(tmp_path / "g2.csv", pd.DataFrame({"a": [1, 0, 0, 0], "b": [0, 1, 0, 0], "c": [0, 0, 1, 1]}))
    out = run_json(
        "generations", "--labels", labels, "--generation", f"g1={g1}", "--generation", f"g2={g2}", "--format", "json"
    )
    assert out["unknown_labels"] == {"g1": 2, "g2": 0}
    text = run_cli("generations", "--labels", labels, "--generation", f"g1={g1}", "--generation", f"g2={g2}")
    assert text.returncode == 0, text.stderr
    assert "unknown labels" in text.stdout


# ---------------------------------------------------------------- item 2: HQ-QS selects teams


def test_hq_qs_is_defined_and_selects_teams():
    from consistency_gate.diagnostics.selection import Pool, hq_scores, select_teams, teams_of_size

    rng = np.random.default_rng(5)
    n, p, m = 300, 4, 5
    y = rng.integers(0, p, n)
    logits = rng.normal(0, 1.5, (m, n, p))
    logits[:, np.arange(n), y] += rng.uniform(0.5, 2.5, (m, 1))
    pool = Pool(np.exp(logits) / np.exp(logits).sum(-1, keepdims=True), y)
    for size in (2, 3):
        assert np.isfinite(hq_scores(pool, teams_of_size(m, size), "qs")).all()
    rows = {r["method"]: r for r in select_teams(pool, metrics=("qs",))["rows"]}
    assert rows["HQ-QS (alpha)"]["teams_selected"] > 0
    assert rows["HQ-QS (alpha+K)"]["teams_selected"] > 0


def test_yule_q_of_a_pair_with_an_always_wrong_focal_model_is_zero():
    from consistency_gate.diagnostics.diversity import pairwise_values, team_diversity

    assert float(pairwise_values(0.0, 0.0, 4.0, 6.0)["qs"]) == 0.0
    oracle = np.array([[0, 0, 0, 0], [1, 0, 1, 0]], dtype=bool)  # member 0 is the focal model, always wrong
    assert team_diversity(oracle, negatives_of=~oracle[0])["qs"] == 0.0


# ---------------------------------------------------------------- item 3: Cohen's kappa


def test_cohen_kappa_is_cohens_and_ck_is_004_formula_1():
    from consistency_gate.diagnostics.diversity import cohen_kappa, pairwise_values

    assert cohen_kappa(5, 2, 1, 2) == pytest.approx(0.3478, abs=1e-4)
    assert float(pairwise_values(5.0, 2.0, 1.0, 2.0)["ck"]) == pytest.approx(0.3556, abs=1e-4)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.booleans()), min_size=2, max_size=40))
def test_cohen_kappa_matches_sklearn(outcomes):
    from sklearn.metrics import cohen_kappa_score

    from consistency_gate.diagnostics.diversity import cohen_kappa

    a = np.array([o[0] for o in outcomes])
    b = np.array([o[1] for o in outcomes])
    counts = [int(x.sum()) for x in (a & b, a & ~b, ~a & b, ~a & ~b)]
    ours = cohen_kappa(*counts)
    with np.errstate(invalid="ignore", divide="ignore"):
        theirs = cohen_kappa_score(a, b)
    if ours is None:
        assert np.isnan(theirs) or len(set(a) | set(b)) == 1
    else:
        assert ours == pytest.approx(theirs, abs=1e-12)


def test_diagnose_reports_cohens_kappa_and_004_ck_side_by_side():
    from sklearn.metrics import cohen_kappa_score

    rng = np.random.default_rng(8)
    n, p = 200, 3
    y = rng.integers(0, p, n)
    probs = rng.dirichlet(np.ones(p), (2, n))
    report = diagnose(["a", "b"], probs, y, ["x", "y", "z"])
    right = probs.argmax(2) == y
    pair = report["pairs"]["a|b"]
    assert pair["cohen_kappa_all"] == pytest.approx(cohen_kappa_score(right[0], right[1]))
    assert pair["ck_004_all"] != pytest.approx(pair["cohen_kappa_all"])


# ---------------------------------------------------------------- item 5: JSON, never NaN


def _strict_json(text: str):
    def refuse(token):
        raise ValueError(f"not JSON: {token}")

    return json.loads(text, parse_constant=refuse)


def test_diagnose_json_is_strict_json_with_a_reason_for_every_null(tmp_path):
    labels = _write(tmp_path / "labels.csv", pd.DataFrame({"label": ["a", "b", "a", "b"]}))
    members = {}
    for name in ("m1", "m2", "m3"):  # identical, perfect members: every diversity value is undefined
        members[name] = _write(
            tmp_path / f"{name}.csv", pd.DataFrame({"a": [0.9, 0.1, 0.8, 0.2], "b": [0.1, 0.9, 0.2, 0.8]})
        )
    args = ["diagnose", "--labels", labels, "--select", "--format", "json"]
    for name, path in members.items():
        args += ["--member", f"{name}={path}"]
    proc = run_cli(*args)
    assert proc.returncode == 0, proc.stderr
    report = _strict_json(proc.stdout)
    assert all(v is None for v in report["diversity"].values())
    assert set(report["diversity_null_reasons"]) == set(report["diversity"])
    for key, value in report["pairs"]["m1|m2"].items():
        if value is None:
            assert f"pairs.m1|m2.{key}" in report["null_reasons"], key


# ---------------------------------------------------------------- item 6: the text follows the numbers


def _two_members(a_right, a_conf, a_wrong_conf, b_right, b_conf, b_wrong_conf, n=100):
    """Two members on n samples of true class 0 of 3: who is right where, and how confident."""
    probs = np.zeros((2, n, 3))
    for k, (right, conf, wrong_conf) in enumerate(((a_right, a_conf, a_wrong_conf), (b_right, b_conf, b_wrong_conf))):
        for i in range(n):
            if i in right:
                probs[k, i] = [conf, (1 - conf) / 2, (1 - conf) / 2]
            else:
                probs[k, i] = [1 - wrong_conf - 0.01, wrong_conf, 0.01]
    return probs, np.zeros(n, dtype=int)


def _explain(probs, y):
    report = diagnose(["A", "B"], probs, y, ["c0", "c1", "c2"])
    return report, " ".join(report["explanation"])


def test_explanation_ensemble_follows_the_better_member():
    probs, y = _two_members(range(80), 0.9, 0.9, range(60), 0.9, 0.55)
    report, text = _explain(probs, y)
    assert report["ensemble_acc"]["avg"] == pytest.approx(0.8)
    assert "stays near A" in text and "follows A on most disagreements" in text
    assert "beats both" not in text and "falls to" not in text


def test_explanation_ensemble_falls_to_the_weaker_member():
    probs, y = _two_members(range(80), 0.4, 0.9, range(60), 0.9, 0.9)
    report, text = _explain(probs, y)
    assert report["ensemble_acc"]["avg"] == pytest.approx(0.6)
    assert "falls to B's level" in text
    assert "stays near A" not in text and "beats both" not in text


def test_explanation_ensemble_beats_both():
    probs, y = _two_members(range(80), 0.9, 0.55, [*range(60), *range(80, 100)], 0.9, 0.55)
    report, text = _explain(probs, y)
    assert report["ensemble_acc"]["avg"] == pytest.approx(1.0)
    assert "beats both members" in text
    assert "stays near" not in text and "adds almost nothing" not in text


def test_explanation_ensemble_equals_both():
    probs, y = _two_members(range(80), 0.9, 0.9, [*range(60), *range(80, 100)], 0.4, 0.55)
    report, text = _explain(probs, y)
    assert report["ensemble_acc"]["avg"] == pytest.approx(0.8)
    assert "about as accurate as both members" in text
    assert "beats both" not in text and "stays near" not in text


# ---------------------------------------------------------------- items 10, 11: messages

_PLACEHOLDER = re.compile(r"\{[A-Za-z_]\w*(\.\w+)*(![rsa])?\}")


def _unfilled_placeholders(path: Path) -> list[str]:
    """String literals of a module that hold ``{name}`` but are neither f-strings nor ``.format``ed."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    format_calls = [
        node.func.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format"
    ]
    templates = {v.id for v in format_calls if isinstance(v, ast.Name)}  # TEMPLATE = "..."; TEMPLATE.format()
    formatted = {id(v) for v in format_calls} | {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in templates for t in node.targets)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            # the literal parts of an f-string (an implicitly joined plain string lands here too)
            source = ast.get_source_segment(path.read_text(), node) or ""
            for part in node.values:
                if isinstance(part, ast.Constant) and _PLACEHOLDER.search(part.value):
                    literal = _PLACEHOLDER.search(part.value).group(0)
                    if "{" + literal + "}" not in source:  # written {{x}} on purpose: a literal brace
                        found.append(f"{path.name}:{node.lineno}: {part.value[:60]!r}")
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
            and id(node) not in formatted
            and _PLACEHOLDER.search(node.value)
        ):
            found.append(f"{path.name}:{node.lineno}: {node.value[:60]!r}")
    return found


def test_no_message_has_an_unfilled_placeholder():
    package = Path(__file__).resolve().parents[1] / "consistency_gate"
    found = [hit for path in sorted(package.rglob("*.py")) for hit in _unfilled_placeholders(path)]
    assert found == []


def test_compare_without_id_column_names_the_column_to_pass(tmp_path):
    labels = _write(tmp_path / "labels.csv", pd.DataFrame({"label": ["a", "b"]}))
    prev = _write(tmp_path / "prev.csv", pd.DataFrame({"a": [0.9, 0.2], "b": [0.1, 0.8], "sid": ["s1", "s2"]}))
    proc = run_cli("compare", "--labels", labels, "--previous", prev, "--candidate", prev)
    assert proc.returncode == 3
    assert "pass --id-column sid" in proc.stderr and "{" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_messages_show_plain_values_not_numpy_reprs(tmp_path):
    labels = _write(tmp_path / "labels.csv", pd.DataFrame({"label": ["a", "b"]}))
    prev = _write(tmp_path / "prev.csv", pd.DataFrame({"a": [0.9, -0.135], "b": [0.1, 0.8]}))
    proc = run_cli("compare", "--labels", labels, "--previous", prev, "--candidate", prev)
    assert proc.returncode == 3
    assert "value -0.135 is negative" in proc.stderr and "np." not in proc.stderr
