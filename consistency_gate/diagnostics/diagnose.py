"""Why an ensemble helps or not: `consistency-gate diagnose` (papers 001 and 004, seed 000).

:func:`diagnose` takes the members' class probabilities on one labelled set and returns one
JSON-able report: each member's accuracy, every pair's consistency metrics with its 2x2
correct/wrong table, the ensemble's accuracy under each combination rule, the oracle upper
bound, who wins the disagreements and whom the averaged ensemble follows, the six diversity
metrics on oracle outputs, the diversity decomposition with the collusion checks, and a
plain-language explanation drawn from those numbers.
"""

from __future__ import annotations

from itertools import combinations
from pathlib import Path

import numpy as np
import pandas as pd

from consistency_gate.core.counts import ConsistencyCounts, Outputs
from consistency_gate.core.evaluation import canonical_classes
from consistency_gate.diagnostics import decomposition as dec
from consistency_gate.diagnostics.diversity import cohen_kappa, pairwise_values, team_diversity
from consistency_gate.ensembles.combine import RULES, combine
from consistency_gate.errors import DataError, UsageError, plain
from consistency_gate.io import predictions as io
from consistency_gate.report.text import finite_or_null


def diagnose(
    names: list[str],
    probs: np.ndarray,
    y: np.ndarray,
    classes: list[str],
    train: tuple[np.ndarray, np.ndarray] | None = None,
) -> dict:
    """The report for members ``names`` with probabilities ``probs`` (M, n, p) and true ids ``y``.

    ``train``: the same members' probabilities and the true ids on their training set, for the
    collusion check's comparison of training and evaluated diversity (Jeffares et al. 2023).

    >>> probs = np.array([[[0.9, 0.1], [0.8, 0.2], [0.3, 0.7]], [[0.6, 0.4], [0.3, 0.7], [0.4, 0.6]]])
    >>> report = diagnose(["a", "b"], probs, np.array([0, 1, 1]), ["x", "y"])
    >>> report["members"]["a"]["acc"], report["members"]["b"]["acc"]
    (0.6666666666666666, 1.0)
    """
    m, n, _ = probs.shape
    if m < 2:
        raise UsageError("diagnose needs at least two members: pairwise metrics and ensembles compare members")
    preds = probs.argmax(axis=2)
    right = preds == y[None]
    acc = right.mean(axis=1)
    weights = acc / acc.sum() if acc.sum() > 0 else np.full(m, 1 / m)
    ensemble = {rule: float((combine(probs, rule, weights).argmax(1) == y).mean()) for rule in RULES}
    negatives = (~right).any(axis=0)
    diversity = team_diversity(right)
    reasons = {}
    if not negatives.any():
        reasons = {k: "no negative samples: every member is right on every sample" for k in diversity}
    else:
        reasons = {k: "undefined for this team (a zero denominator)" for k, v in diversity.items() if v is None}
    report = {
        "n": int(n),
        "classes": len(classes),
        "members": {name: {"acc": float(a)} for name, a in zip(names, acc, strict=True)},
        "pairs": {f"{names[i]}|{names[j]}": _pair(probs[i], probs[j], y) for i, j in combinations(range(m), 2)},
        "ensemble_acc": ensemble,
        "oracle_upper_bound": float(right.any(axis=0).mean()),
        "negative_samples": int(negatives.sum()),
        "diversity": diversity,
        "diversity_null_reasons": reasons,
        "decomposition": _decomposition(probs, y),
        "disagreements": _disagreements(names, probs, preds, right),
        "collusion": _collusion(probs, y, train),
    }
    report["explanation"] = explain(report, names) + report["collusion"]["warnings"]
    return _with_null_reasons(report)


def _with_null_reasons(report: dict) -> dict:
    """The report with every undefined number as null and the reason for it in ``null_reasons``."""
    reasons: dict[str, str] = {}
    if report["decomposition"].get("debiasing_share") is None:
        reasons["decomposition.debiasing_share"] = "the members do not differ (diversity is 0), so no share of it"
    for part, numbers in report["collusion"].items():
        if part == "warnings":
            continue
        if numbers is None:
            reasons[f"collusion.{part}"] = "no training-set predictions given (diagnose --train-member)"
            continue
        if numbers["div_share"] is None:
            reasons[f"collusion.{part}.div_share"] = "the members' mean loss is 0, so no share of it"
        if numbers["debiasing_share_logits"] is None:
            reasons[f"collusion.{part}.debiasing_share_logits"] = "the members do not differ, so no share of it"
    for key, pair in report["pairs"].items():
        if pair["yule_q_all"] is None:
            reasons[f"pairs.{key}.yule_q_all"] = "0/0: no sample where one member is right and the other wrong"
        if pair["cohen_kappa_all"] is None:
            reasons[f"pairs.{key}.cohen_kappa_all"] = "chance agreement is 1 (a member is always right or wrong)"
        if pair["ck_004_all"] is None:
            reasons[f"pairs.{key}.ck_004_all"] = "a zero denominator (a member is always right or always wrong)"
        for metric, why in pair.pop("null_reasons", {}).items():
            reasons[f"pairs.{key}.{metric}"] = why
    clean = finite_or_null(report, reasons)
    clean["null_reasons"] = reasons
    return clean


def _pair(a: np.ndarray, b: np.ndarray, y: np.ndarray) -> dict:
    cols = np.arange(a.shape[1])
    pair = ConsistencyCounts().update(y, Outputs.from_scores(a, cols, 1), Outputs.from_scores(b, cols, 1))
    values, reasons = pair.compute()
    values["null_reasons"] = reasons
    counts = pair.flip_counts  # the 2x2 right/wrong table: CtoC, CtoI, ItoC, ItoI
    values["table"] = dict(zip(("both_right", "only_first", "only_second", "both_wrong"), counts, strict=True))
    # error correlation over all samples (on negatives alone a pair's Q is always -1: N11 = 0 there)
    n11, n10, n01, n00 = counts
    values["yule_q_all"] = (n11 * n00 - n01 * n10) / (n11 * n00 + n01 * n10) if n11 * n00 + n01 * n10 else None
    values["cohen_kappa_all"] = cohen_kappa(n11, n10, n01, n00)  # Cohen's, as sklearn's cohen_kappa_score
    ck = float(pairwise_values(*(np.float64(c) for c in counts))["ck"])
    values["ck_004_all"] = None if np.isnan(ck) else ck  # "CK, HDP Formula 1"
    return values


def _decomposition(probs: np.ndarray, y: np.ndarray) -> dict:
    log_scores = np.log(np.clip(probs, 1e-12, None))  # members' log-probabilities as scores
    return {
        **dec.losses(probs, y),
        "div_ce_probability_averaging": dec.diversity_ce_probs(probs, y),
        "div_ce_score_averaging": dec.diversity_ce_scores(log_scores),
        "div_brier": dec.diversity_brier(probs),
        "debiasing_share": dec.debiasing_share(probs),
        "codependence": dec.codependence(probs, y),
    }


def _collusion(probs: np.ndarray, y: np.ndarray, train: tuple[np.ndarray, np.ndarray] | None) -> dict:
    evaluated = dec.collusion_numbers(probs, y)
    trained = None if train is None else dec.collusion_numbers(*train)
    return {"evaluated": evaluated, "train": trained, "warnings": collusion_warnings(evaluated, trained)}


# Jeffares et al. 2023's collusion signature. Pseudo-diversity: on the training set DIV is at least half the mean
# member loss (the members are wrong apart, the ensemble right together) and at least twice the evaluated
# set's DIV (it does not carry over), and it is material: at least a tenth of the evaluated set's mean
# member loss (where every member fits the training set, a hundredth of a nat can be half of a near-zero
# loss). benchmarks/reproduce_collusion.py, 6 seeds: with 20% noisy training labels beta = 1 gives a
# training DIV of 0.35-0.73 against 0.06-0.13 on the test set (all flagged); beta = 0.95 0.03-0.08
# against 0.03-0.05 and independent training (beta = 0) 0.000 against 0.02 (none flagged).
# Bias collusion: one constant offset per member explains half the members' diversity or more (001
# Section 6.1 finds "around half" at beta = 1; our members stay under 0.2), where the members differ at
# all: DIV at least 5% of the mean member loss (near-copies' tiny offsets explain all of their tiny
# diversity).
PSEUDO_DIVERSITY_SHARE = 0.5
PSEUDO_DIVERSITY_RATIO = 2.0
MATERIAL_TRAINING_DIVERSITY = 0.1
BIAS_SHARE = 0.5
MATERIAL_DIVERSITY_SHARE = 0.05


def collusion_warnings(evaluated: dict, train: dict | None = None) -> list[str]:
    """The warnings for Jeffares et al. 2023's collusion signature, from :func:`decomposition.collusion_numbers`
    on the evaluated set and, where given, on the training set; empty when there is no sign of it.

    >>> evaluated = {"ce_members": 0.45, "div": 0.09, "div_share": 0.2, "debiasing_share_logits": 0.1}
    >>> train = {"ce_members": 0.7, "div": 0.6, "div_share": 0.86, "debiasing_share_logits": 0.1}
    >>> collusion_warnings(evaluated, train)[0][:49]
    'Warning: learner collusion (Jeffares et al. 2023)'
    >>> collusion_warnings(evaluated)
    []
    """
    warnings = []
    share, train_share = evaluated["div_share"], None if train is None else train["div_share"]
    if (
        train_share is not None
        and train_share >= PSEUDO_DIVERSITY_SHARE
        and train["div"] >= PSEUDO_DIVERSITY_RATIO * evaluated["div"]
        and train["div"] >= MATERIAL_TRAINING_DIVERSITY * evaluated["ce_members"]
    ):
        warnings.append(
            f"Warning: learner collusion (Jeffares et al. 2023): on the training set diversity is {train_share:.0%} "
            f"of the mean member loss (DIV {train['div']:.3f}), on the evaluated set {share or 0.0:.0%} (DIV "
            f"{evaluated['div']:.3f}). The members are wrong apart and right together on the data they were "
            "trained on, and that diversity does not carry over: train them independently, or with a smaller "
            "share of ensemble loss in the objective (beta), before trusting the ensemble's diversity."
        )
    bias = evaluated["debiasing_share_logits"]
    if bias is not None and bias >= BIAS_SHARE and (share or 0.0) >= MATERIAL_DIVERSITY_SHARE:
        warnings.append(
            f"Warning: learner collusion (Jeffares et al. 2023): one constant offset per member explains {bias:.0%} "
            "of the members' diversity (centred log-probabilities): they differ mostly by biases that cancel in the "
            "average, not by what they get right. Dropping or replacing a member will move the ensemble more "
            "than its accuracy suggests."
        )
    return warnings


def _disagreements(names: list[str], probs: np.ndarray, preds: np.ndarray, right: np.ndarray) -> dict:
    """Where members predict different classes: who is right, whom the AVG ensemble follows, confidence."""
    ens = probs.mean(axis=0).argmax(axis=1)
    differ = (preds != preds[0]).any(axis=0)
    count = int(differ.sum())
    out = {
        "count": count,
        "share_of_samples": float(differ.mean()),
        "won": {},
        "ensemble_follows": {},
        "mean_confidence": {},
    }
    for i, name in enumerate(names):
        if count:
            out["won"][name] = float(right[i][differ].mean())
            out["ensemble_follows"][name] = float((ens[differ] == preds[i][differ]).mean())
            out["mean_confidence"][name] = float(probs[i][differ].max(axis=1).mean())
    return out


# the explanation calls two accuracies "the same" when they differ by at most this much, or by a
# tenth of the gap between the two members if that is larger (0.5 points between members 7 apart
# is "near" the better one; between members 0.6 apart it is not)
SAME_ACCURACY = 0.005
SAME_SHARE_OF_GAP = 0.1


def explain(report: dict, names: list[str]) -> list[str]:
    """Plain-language findings drawn from the report's numbers: every sentence follows from a
    number the report prints (tested against crafted cases: the ensemble follows one member,
    beats both, equals both).

    >>> probs = np.array([[[0.9, 0.1], [0.8, 0.2], [0.3, 0.7]], [[0.6, 0.4], [0.3, 0.7], [0.4, 0.6]]])
    >>> report = diagnose(["a", "b"], probs, np.array([0, 1, 1]), ["x", "y"])
    >>> explain(report, ["a", "b"])[0][:60]
    'The best member, b, is right on 100.00%; the averaged ensemb'
    """
    n = report["n"]
    acc = {k: v["acc"] for k, v in report["members"].items()}
    best = max(names, key=lambda k: acc[k])
    avg = report["ensemble_acc"]["avg"]
    lines = [
        f"The best member, {best}, is right on {acc[best]:.2%}; the averaged ensemble on {avg:.2%} "
        f"({100 * (avg - acc[best]):+.2f} points). An oracle that always picked a right member would reach "
        f"{report['oracle_upper_bound']:.2%}: that is the most any combination of these members can give."
    ]
    for other in (k for k in names if k != best):
        key = f"{best}|{other}" if f"{best}|{other}" in report["pairs"] else f"{other}|{best}"
        table = report["pairs"][key]["table"]
        first_is_best = key.startswith(f"{best}|")
        gain = table["only_second"] if first_is_best else table["only_first"]
        loss = table["only_first"] if first_is_best else table["only_second"]
        lines.append(
            f"{other} is right on {gain} samples ({gain / n:.2%}) where {best} is wrong, and wrong on {loss} "
            f"where {best} is right; the two agree on {report['pairs'][key]['con']:.2%} of samples. So {other} "
            f"can add at most {100 * gain / n:.2f} points to {best}"
            + (" and adds almost nothing." if gain / n < 0.01 else ".")
        )
    dis = report["disagreements"]
    if dis["count"] and len(names) == 2:
        lines.append(_two_member_finding(report, names, best, avg, acc))
    for key, pair in report["pairs"].items():
        if pair["yule_q_all"] is not None:
            a, b = key.split("|")
            lines.append(
                f"How correlated {a} and {b} are: Yule's Q of their right/wrong outcomes {pair['yule_q_all']:.2f} "
                f"(1: right and wrong together, 0: independent), Cohen's kappa {_fmt(pair['cohen_kappa_all'])}, "
                f"Pearson correlation of their probability vectors {_fmt(pair['pearson'])}."
            )
    d = report["decomposition"]
    lines.append(
        f"Diversity (member loss minus ensemble loss, cross-entropy, probability averaging): "
        f"{d['div_ce_probability_averaging']:.4f} of a mean member loss of {d['ce_members']:.4f}."
    )
    return lines


def _two_member_finding(report: dict, names: list[str], best: str, avg: float, acc: dict[str, float]) -> str:
    """Where two members disagree, whom the averaged ensemble sides with, and what that does to its
    accuracy. Where both agree the average predicts their class too (each member's top class
    outscores every other in both, so in the mean), so the ensemble's accuracy moves only here."""
    dis = report["disagreements"]
    other = next(k for k in names if k != best)
    follows = dis["ensemble_follows"][best]
    conf_best, conf_other = dis["mean_confidence"][best], dis["mean_confidence"][other]
    text = (
        f"On the {dis['count']} samples where they disagree ({dis['share_of_samples']:.2%}), {best} is right on "
        f"{dis['won'][best]:.0%} and {other} on {dis['won'][other]:.0%}; the averaged ensemble sides with {best} on "
        f"{follows:.0%} and with {other} on {dis['ensemble_follows'][other]:.0%} of them (mean top probability "
        f"there: {best} {conf_best:.2f}, {other} {conf_other:.2f}). "
    )
    tol = max(SAME_ACCURACY, SAME_SHARE_OF_GAP * (acc[best] - acc[other]))
    near_best = abs(avg - acc[best]) <= tol
    near_other = abs(avg - acc[other]) <= tol
    if near_best and near_other:
        return text + (
            f"The ensemble is about as accurate as both members ({avg:.2%}): combining them gains nothing, "
            "because the disagreements the ensemble resolves right and wrong cancel out."
        )
    if avg > acc[best] + tol:
        return text + (
            f"The ensemble beats both members ({100 * (avg - acc[best]):+.2f} points over {best}): on the "
            f"disagreements it picks the right answer more often than {best} does alone."
        )
    if near_best:
        cause = (
            f"it follows {best} on most disagreements, where {best} is the more confident one"
            if follows >= 0.5 and conf_best >= conf_other
            else f"its right and wrong picks among the disagreements balance out to {best}'s accuracy"
        )
        return text + f"The ensemble stays near {best} ({100 * (avg - acc[best]):+.2f} points) because {cause}."
    if near_other:
        return text + (
            f"The ensemble falls to {other}'s level ({avg:.2%}) because on the disagreements it sides with "
            f"{other} {dis['ensemble_follows'][other]:.0%} of the time, and {other} is wrong more often there."
        )
    where = "between the two members" if acc[other] < avg < acc[best] else "below both members"
    return text + f"The ensemble's accuracy ({avg:.2%}) lies {where}."


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def load_member_files(
    labels: str | Path, members: dict[str, str | Path], label_column: str = "label", id_column: str | None = None
) -> tuple[list[str], np.ndarray, np.ndarray, list[str]]:
    """Read a labels file and member prediction files (the `compare` format) into (names, probs, y, classes).

    Classes are aligned by name over the union of all files (a class a member lacks has
    probability 0); hard-label members become one-hot. Files are read whole.

    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> _ = (folder / "labels.csv").write_text("label\\nx\\ny\\n")
    >>> _ = (folder / "a.csv").write_text("x,y\\n0.9,0.1\\n0.4,0.6\\n")
    >>> _ = (folder / "b.csv").write_text("prediction\\nx\\nx\\n")
    >>> members = {"a": folder / "a.csv", "b": folder / "b.csv"}
    >>> names, probs, y, classes = load_member_files(folder / "labels.csv", members)
    >>> names, probs.shape, y.tolist(), classes
    (['a', 'b'], (2, 2, 2), [0, 1], ['x', 'y'])
    """
    labels = Path(labels)
    cols = io.file_columns(labels)
    flags = io.column_flags(label_column, id_column)
    io.require_columns(labels, cols, [label_column] + ([id_column] if id_column else []), flags)
    fields = ([id_column] if id_column else []) + [label_column]
    truth = pd.concat(list(io.iter_frames(labels, fields, text_columns=tuple(fields))))
    if truth.empty:
        raise DataError(f"{labels}: the file has a header but no rows")
    frames = {}
    for name, path in members.items():
        source = io.inspect_prediction_file(path, id_column)
        text = ((id_column,) if id_column else ()) + (() if source.has_scores else (io.HARD_LABEL_COLUMN,))
        frame = pd.concat(list(io.iter_frames(source.path, source.columns, text_columns=text)))
        frame = _align(frame, truth, id_column, source.path, labels)
        body = (
            pd.DataFrame(io.score_matrix(frame, source), columns=list(source.classes))
            if source.has_scores
            else io.hard_labels(frame, source).reset_index(drop=True)
        )
        frames[name] = body
    return frames_to_arrays(frames, truth[label_column].reset_index(drop=True))


def frames_to_arrays(
    frames: dict[str, pd.DataFrame | pd.Series], truth: pd.Series
) -> tuple[list[str], np.ndarray, np.ndarray, list[str]]:
    """Member frames (score columns, or a hard-label series) and true labels -> aligned arrays.

    Classes are in the canonical order (the members' classes sorted as text, then any true label
    no member knows), so argmax ties go to the class whose label sorts first, as in ``compare``.

    >>> frames = {"a": pd.DataFrame({"y": [0.2, 0.6], "x": [0.8, 0.4]}), "b": pd.Series(["y", "y"])}
    >>> names, probs, y, classes = frames_to_arrays(frames, pd.Series(["x", "y"]))
    >>> classes, probs[1].tolist(), y.tolist()
    (['x', 'y'], [[0.0, 1.0], [0.0, 1.0]], [0, 1])
    """
    classes = canonical_classes(
        [list(body.columns) if isinstance(body, pd.DataFrame) else list(body.unique()) for body in frames.values()]
    )
    classes += sorted({str(c) for c in truth.unique()} - set(classes))
    index = {c: i for i, c in enumerate(classes)}
    n, p = len(truth), len(classes)
    probs = np.zeros((len(frames), n, p))
    for k, body in enumerate(frames.values()):
        if isinstance(body, pd.DataFrame):
            probs[k][:, [index[str(c)] for c in body.columns]] = body.to_numpy(dtype=np.float64)
        else:
            probs[k][np.arange(n), [index[str(v)] for v in body]] = 1.0
    y = np.array([index[str(v)] for v in truth])
    return list(frames), probs, y, classes


def _align(frame: pd.DataFrame, truth: pd.DataFrame, id_column: str | None, path: Path, labels: Path) -> pd.DataFrame:
    if id_column is None:
        if len(frame) != len(truth):
            raise DataError(
                f"members on different sample sets: {path} has {len(frame)} rows, {labels} has "
                f"{len(truth)}; give one row per sample or align with --id-column"
            )
        return frame.reset_index(drop=True)
    ids = io.unique_ids(frame[id_column], path, id_column)
    missing = ~truth[id_column].isin(ids)
    if missing.any() or len(ids) != len(truth):
        example = truth[id_column][missing].iloc[0] if missing.any() else ids[~ids.isin(truth[id_column])].iloc[0]
        raise DataError(f"members on different sample sets: {path} and {labels} differ in ids (e.g. {plain(example)})")
    return frame.set_index(id_column).loc[truth[id_column].to_numpy()].reset_index()


def run_diagnose(
    labels: str | Path | None,
    members: dict[str, str],
    *,
    data: str | Path | None = None,
    tracking_uri: str | None = None,
    label_column: str = "label",
    id_column: str | None = None,
    select: bool = False,
    max_team_size: int | None = None,
    html: bool = False,
    train_labels: str | Path | None = None,
    train_members: dict[str, str] | None = None,
    train_data: str | Path | None = None,
) -> tuple[dict, str | None]:
    """Load the members (files, or ``models:/NAME/VERSION`` predicted on ``data``), diagnose,
    optionally select teams, and render the HTML page. Returns (report, html or None).

    The training set, for the collusion check: ``train_members`` (one file per member, the same
    names) with ``train_labels``, or for registry members ``train_data`` to predict.

    Example::

        report, html = run_diagnose("labels.csv", {"gen1": "gen1.csv", "gen2": "gen2.csv"})
        report["explanation"][0]
        # 'The best member, gen2, is right on ...'
    """
    if len(members) < 2:
        raise UsageError("diagnose needs at least two --member options: pairwise metrics compare two members")
    registry_members = {k: v for k, v in members.items() if str(v).startswith("models:/")}
    if registry_members:
        names, probs, y, classes = _load_registry_members(members, data, tracking_uri, label_column, id_column)
    else:
        if labels is None:
            raise UsageError("--labels is required with prediction files")
        names, probs, y, classes = load_member_files(labels, members, label_column, id_column)
    train = None
    if train_members or train_data is not None:
        train = _training_set(
            names, classes, members, train_labels, train_members, train_data, tracking_uri, label_column, id_column
        )
    report = diagnose(names, probs, y, classes, train)
    if select:
        from consistency_gate.diagnostics.selection import Pool, select_teams

        if max_team_size is not None and max_team_size > len(names):
            raise UsageError(f"--max-team-size {max_team_size} is larger than the pool of {len(names)} members")
        if len(names) < 3:
            raise UsageError("--select needs a pool of at least 3 members")
        reasons = report["null_reasons"]
        report["selection"] = finite_or_null(select_teams(Pool(probs, y), max_size=max_team_size), reasons, "selection")
    return report, (render_html(report, names, probs, y, classes) if html else None)


def _training_set(
    names: list[str],
    classes: list[str],
    members: dict[str, str],
    labels: str | Path | None,
    train_members: dict[str, str] | None,
    data: str | Path | None,
    tracking_uri: str | None,
    label_column: str,
    id_column: str | None,
) -> tuple[np.ndarray, np.ndarray]:
    """The members' probabilities (in ``names`` and ``classes`` order) and true ids on their training set."""
    if data is not None:
        if not all(str(v).startswith("models:/") for v in members.values()):
            raise UsageError("--train-data predicts registry members (models:/...); give files with --train-member")
        t_names, t_probs, t_y, t_classes = _load_registry_members(members, data, tracking_uri, label_column, id_column)
    else:
        if labels is None:
            raise UsageError("--train-member needs --train-labels with the training set's true labels")
        if set(train_members or {}) != set(names):
            raise UsageError(
                f"--train-member must name the same members as --member ({', '.join(names)}), "
                f"got {', '.join(train_members or {}) or 'none'}"
            )
        t_names, t_probs, t_y, t_classes = load_member_files(labels, train_members or {}, label_column, id_column)
    unknown = [c for c in t_classes if c not in classes]
    if unknown:
        raise DataError(
            f"the training set ({data or labels} and the --train-member files) has class {plain(unknown[0])}, "
            "which the evaluated set's members and labels lack; give both sets the same classes"
        )
    column = [classes.index(c) for c in t_classes]
    probs = np.zeros((len(names), t_probs.shape[1], len(classes)))
    probs[:, :, column] = t_probs[[t_names.index(name) for name in names]]
    return probs, np.asarray(column)[t_y]


def render_html(report: dict, names: list[str], probs: np.ndarray, y: np.ndarray, classes: list[str]) -> str:
    """The ``diagnose --format html`` page: the report with its plots inlined as PNG.

    >>> probs = np.array([[[0.9, 0.1], [0.8, 0.2], [0.3, 0.7]], [[0.6, 0.4], [0.3, 0.7], [0.4, 0.6]]])
    >>> report = diagnose(["a", "b"], probs, np.array([0, 1, 1]), ["x", "y"])
    >>> render_html(report, ["a", "b"], probs, np.array([0, 1, 1]), ["x", "y"]).startswith("<!doctype html>")
    True
    """
    from consistency_gate.report import plots
    from consistency_gate.report.html import diagnose_html

    first = report["pairs"][f"{names[0]}|{names[1]}"]
    figs = {
        f"errors of {names[0]} vs {names[1]}": plots.correctness_matrix(
            first["table"]["both_right"],
            first["table"]["only_first"],
            first["table"]["only_second"],
            first["table"]["both_wrong"],
        ),
        "confidence on disagreements": plots.disagreement_confidence(names, probs),
        "disagreement per class": plots.class_disagreement(classes, probs, y),
    }
    if report.get("selection"):
        figs["diversity vs accuracy"] = plots.diversity_scatter(report["selection"]["scatter"], "gd")
    pngs = {name: plots.png_bytes(fig, dpi=90) for name, fig in figs.items()}
    return diagnose_html(report, pngs)


def _load_registry_members(
    members: dict[str, str],
    data: str | Path | None,
    tracking_uri: str | None,
    label_column: str,
    id_column: str | None,
) -> tuple[list[str], np.ndarray, np.ndarray, list[str]]:

    from consistency_gate.mlops import registry, scoring, store

    if data is None:
        raise UsageError("registry members (models:/...) need --data with their features and labels")
    frame = io.read_evaluation_data(Path(data), label_column, id_column)
    _, client = store.connect(tracking_uri, existing=True)
    frames = {}
    for name, source in members.items():
        if not str(source).startswith("models:/"):
            raise UsageError(f"--member {name}: mix of files and registry models; use one kind with --data")
        ref = registry.ref_from_uri(client, str(source))
        frames[name] = scoring.predict(scoring.load_model(ref), frame, scoring.non_features(label_column, id_column))
    return frames_to_arrays(frames, frame[label_column].astype(str).reset_index(drop=True))
