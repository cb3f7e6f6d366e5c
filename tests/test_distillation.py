"""Single-model remediation by distillation: the focal distillation loss (by hand, against an
independent numpy implementation, its invariants), the config block, and the two training
methods on tiny data."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from consistency_gate.ensembles.config import Distillation, RemediationConfig, TrainSettings
from consistency_gate.ensembles.distillation import focal_distillation_loss, logits_of, with_distillation
from consistency_gate.ensembles.recipes import RecipeSpec, array_recipe
from consistency_gate.ensembles.remediation import teacher_logits, train_ensemble
from consistency_gate.ensembles.snapshot import train_members
from consistency_gate.errors import ModelError, UsageError
from consistency_gate.gate.config import parse_config


def _numpy_focal_distillation(student, teacher, y, d: Distillation) -> float:
    """The focal-weighted mean of the per-sample terms of Yan et al. (2021), FD-KL / FD-LM, written
    independently in numpy."""
    student, teacher = np.asarray(student, np.float64), np.asarray(teacher, np.float64)
    if d.loss == "kl":
        t = d.temperature
        q = np.exp(teacher / t - np.logaddexp.reduce(teacher / t, axis=1, keepdims=True))
        log_p = student / t - np.logaddexp.reduce(student / t, axis=1, keepdims=True)
        per_sample = (q * (np.log(q) - log_p)).sum(axis=1) * t * t
    else:
        per_sample = ((student - teacher) ** 2).mean(axis=1) / 2  # PCT's main.py: mean squared difference / 2
    weights = d.alpha + d.beta * (teacher.argmax(axis=1) == y)
    return float((weights * per_sample).sum() / weights.sum()) if weights.sum() > 0 else 0.0


logit_rows = arrays(np.float32, (6, 4), elements=st.floats(-8, 8, width=32))


@settings(max_examples=60, deadline=None)
@given(
    logit_rows,
    logit_rows,
    arrays(np.int64, 6, elements=st.integers(0, 3)),
    st.sampled_from(["kl", "lm"]),
    st.one_of(st.just(0.0), st.floats(0.01, 3)),  # float32 weights: no subnormal ones
    st.one_of(st.just(0.0), st.floats(0.01, 8)),
    st.sampled_from([1.0, 4.0, 100.0]),
)
def test_loss_equals_an_independent_implementation(student, teacher, y, loss, alpha, beta, temperature):
    d = Distillation(loss=loss, alpha=alpha, beta=beta, temperature=temperature, weight=0.7)
    # in float64: the float32 softmax at temperature t, times t², rounds by about 1e-7 t², which the
    # focal-weighted mean does not shrink when the weights are small
    student64, teacher64 = (torch.from_numpy(np.asarray(a, np.float64)) for a in (student, teacher))
    got = float(focal_distillation_loss(student64, teacher64, torch.from_numpy(y), d))
    assert got == pytest.approx(_numpy_focal_distillation(student, teacher, y, d), rel=1e-9, abs=1e-9)
    assert got >= -1e-12  # a divergence and a squared error are never negative


@settings(max_examples=40, deadline=None)
@given(logit_rows, arrays(np.int64, 6, elements=st.integers(0, 3)), st.sampled_from(["kl", "lm"]))
def test_a_student_equal_to_its_teacher_costs_nothing(z, y, loss):
    t = torch.from_numpy(z)
    assert float(focal_distillation_loss(t, t.clone(), torch.from_numpy(y), Distillation(loss=loss))) == pytest.approx(
        0.0, abs=1e-4
    )


def test_focal_weights_by_hand():
    # FD-LM: sample 1 (teacher right) D = mean((0-4)^2, 0) / 2 = 8 / 2 = 4 (half, as PCT), weight alpha + beta = 3;
    # sample 2 (wrong) D = mean((0-2)^2, 0) / 2 = 1, weight alpha = 1: (3 * 4 + 1 * 1) / (3 + 1) = 3.25
    student, teacher, y = torch.zeros(2, 2), torch.tensor([[4.0, 0.0], [2.0, 0.0]]), torch.tensor([0, 1])
    d = Distillation(loss="lm", alpha=1.0, beta=2.0, weight=0.5)
    assert float(focal_distillation_loss(student, teacher, y, d)) == pytest.approx(3.25)
    # mixed with a classification loss of 2.0: (2.0 + 0.5 * 3.25) / 1.5
    assert float(with_distillation(torch.tensor(2.0), student, teacher, y, d)) == pytest.approx(3.625 / 1.5)
    # only the teacher's right samples count when alpha is 0; none right: the term is 0, not NaN
    d = Distillation(loss="lm", alpha=0.0, beta=2.0)
    assert float(focal_distillation_loss(student, teacher, y, d)) == pytest.approx(4.0)
    assert float(focal_distillation_loss(student, teacher, torch.tensor([1, 1]), d)) == 0.0
    # FD-KL at temperature 1 of a uniform student toward [e^4, 1] / (e^4 + 1): sum q log(q / 0.5)
    teacher = torch.tensor([[4.0, 0.0], [4.0, 0.0]])
    q = np.array([np.exp(4.0), 1.0]) / (np.exp(4.0) + 1)
    kl = float((q * np.log(q / 0.5)).sum())
    d = Distillation(alpha=1.0, beta=0.0, temperature=1.0)
    assert float(focal_distillation_loss(student, teacher, y, d)) == pytest.approx(kl, rel=1e-6)


@settings(max_examples=40, deadline=None)
@given(
    logit_rows,
    arrays(np.int64, 6, elements=st.integers(0, 3)),
    st.one_of(st.just(0.0), st.floats(0.01, 3)),
    st.one_of(st.just(0.0), st.floats(0.01, 8)),
    st.floats(0, 10),
)
def test_the_loss_keeps_the_cross_entropys_scale_whatever_the_focal_weights(student, y, alpha, beta, weight):
    """Toward a teacher that is right and sure (one-hot at temperature 1), D is the cross-entropy, so
    the training loss is the cross-entropy itself for any alpha, beta and weight: the focal weights
    never scale the step SGD takes (PCT's plain sum made it up to 1 + alpha + beta times larger)."""
    z, labels = torch.from_numpy(student), torch.from_numpy(y)
    teacher = torch.nn.functional.one_hot(labels, 4).float() * 60.0
    ce = torch.nn.functional.cross_entropy(z, labels)
    assume(alpha + beta > 0)  # with no weight at all the term is 0 and the loss CE / (1 + weight)
    d = Distillation(alpha=alpha, beta=beta, temperature=1.0, weight=weight)
    assert float(with_distillation(ce, z, teacher, labels, d)) == pytest.approx(float(ce), rel=1e-4, abs=1e-5)


def test_logits_of_probabilities_give_them_back_under_softmax():
    p = np.array([[0.7, 0.2, 0.1], [0.0, 1.0, 0.0]])
    z = logits_of(p)
    assert np.isfinite(z).all()
    assert np.allclose(torch.softmax(torch.from_numpy(z), dim=1).numpy(), p, atol=1e-7)


def test_config_block_overrides_the_methods_default():
    rule = "rules:\n  - {metric: con, min: 0.9}\n"
    config = parse_config(
        rule + "remediation:\n  data: t.csv\n  method: ensemble-distillation\n  teacher_method: extbagging\n"
        "  distillation: {loss: lm, weight: 2.0}\n",
        "gate.yaml",
    )
    settings_ = config.remediation.settings
    assert settings_.teacher_method == "extbagging"
    # ensemble-distillation's default is plain distillation at temperature 4; the config sets the rest
    assert settings_.distillation_term == Distillation(loss="lm", alpha=1.0, beta=0.0, temperature=4.0, weight=2.0)
    config = parse_config(rule + "remediation:\n  data: t.csv\n  method: focal-distillation\n", "gate.yaml")
    assert config.remediation.settings.distillation_term == Distillation(alpha=1.0, beta=5.0, temperature=4.0)
    assert config.remediation.settings.distillation_term.clip == 5.0
    config = parse_config(rule + "remediation:\n  data: t.csv\n  distillation: {clip: 0}\n", "gate.yaml")
    assert config.remediation.for_method("focal-distillation").settings.distillation_term.clip is None


def _blobs(n=240, classes=3, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    centers = rng.normal(0, 2.0, (classes, 5))
    return (centers[y] + rng.normal(0, 1.0, (n, 5))).astype(np.float32), y


def _agreement(build, recipe, x, teacher):
    model = recipe.model()
    model.load_state_dict(build.members[0].state)
    model.eval()
    with torch.no_grad():
        predicted = model(torch.from_numpy(x)).argmax(dim=1).numpy()
    return float((predicted == teacher.argmax(axis=1)).mean())


def test_distillation_follows_the_teacher_and_focal_weights_only_where_it_was_right():
    """A teacher that is wrong in one region of the inputs (it says y + 1 where x0 is in its top
    third). Plain distillation (alpha 1, beta 0) takes the teacher's side there, unlike training on
    the labels alone; focal distillation that weighs only the samples the teacher got right
    (alpha 0) does not copy its mistakes, and stays as accurate as training on the labels."""
    x, y = _blobs()
    wrong = x[:, 0] > np.quantile(x[:, 0], 0.67)
    teacher = np.eye(3, dtype=np.float32)[np.where(wrong, (y + 1) % 3, y)] * 6
    recipe = array_recipe(RecipeSpec("mlp", {"hidden": [32]}, 5, 3), x, y)

    def train(method, distillation=None):
        settings_ = TrainSettings(method=method, epochs=30, seed=2, lr=0.05, distillation=distillation)
        return train_members(recipe, settings_, quiet=True, teacher=None if method == "singlebase" else teacher)

    plain = train("singlebase")
    copying = train("focal-distillation", Distillation(alpha=1.0, beta=0.0, weight=3.0))
    focal = train("focal-distillation", Distillation(alpha=0.0, beta=1.0, weight=3.0))
    assert _agreement(copying, recipe, x, teacher) > _agreement(plain, recipe, x, teacher) + 0.15
    assert _agreement(focal, recipe, x, teacher) < _agreement(copying, recipe, x, teacher) - 0.15
    assert focal.members[0].val_acc > copying.members[0].val_acc + 0.1


def test_focal_distillation_needs_a_teacher_of_the_right_shape():
    x, y = _blobs(n=30)
    recipe = array_recipe(RecipeSpec("mlp", {"hidden": [4]}, 5, 3), x, y)
    settings_ = TrainSettings(method="focal-distillation", epochs=1)
    with pytest.raises(UsageError, match="none were given"):
        train_members(recipe, settings_, quiet=True)
    with pytest.raises(UsageError, match="logits for the 30 training samples, got shape"):
        train_members(recipe, settings_, quiet=True, teacher=np.zeros((29, 3)))
    with pytest.raises(UsageError, match="takes no teacher"):
        train_members(recipe, TrainSettings(method="singlebase", epochs=1), quiet=True, teacher=np.zeros((30, 3)))


def test_ensemble_distillation_trains_one_student_and_counts_the_teachers_cost():
    x, y = _blobs()
    recipe = array_recipe(RecipeSpec("mlp", {"hidden": [16]}, 5, 3), x, y)
    settings_ = TrainSettings(method="ensemble-distillation", teacher_method="extbagging", m=3, epochs=5, seed=4)
    build = train_members(recipe, settings_, quiet=True)
    assert len(build.members) == 1
    assert len(build.runs) == 4 and [r.run for r in build.runs] == [0, 1, 2, 3]  # 3 teachers, then the student
    assert build.kappa == 4
    assert build.members[0].val_acc > 0.8


def _training_file(tmp_path, n=60):
    x, y = _blobs(n=n)
    frame = pd.DataFrame(x, columns=[f"f{i}" for i in range(5)]).assign(label=np.array(["a", "b", "c"])[y])
    path = tmp_path / "train.csv"
    frame.to_csv(path, index=False)
    return path, frame


def test_the_gate_side_teacher_scores_the_training_file_in_the_students_class_order(tmp_path):
    path, frame = _training_file(tmp_path)
    seen = []

    def teacher(samples):  # the previous generation: knows classes c, b and an extra one; not a
        seen.append(list(samples.columns))
        right = frame["label"].to_numpy()[:, None] == np.array(["c", "b", "z"])
        return pd.DataFrame(np.where(right, 0.9, 0.05), columns=["c", "b", "z"])

    config = RemediationConfig(
        path, recipe="mlp", recipe_options={"hidden": [8]},
        settings=TrainSettings(method="focal-distillation", epochs=2),
    )  # fmt: skip
    ensemble, build = train_ensemble(config, None, quiet=True, teacher=teacher)
    assert seen == [[f"f{i}" for i in range(5)]]  # features only, never the label
    assert ensemble.classes == ["a", "b", "c"] and len(build.members) == 1
    logits = teacher_logits(teacher, frame, ["a", "b", "c"], "train.csv")
    assert (logits[:, 0] < -18).all()  # class a unknown to the teacher: probability 0
    assert np.allclose(np.exp(logits[:, 1:]), np.where(frame[["label"]].to_numpy() == ["b", "c"], 0.9, 0.05))


def test_the_gate_refuses_focal_distillation_without_a_usable_teacher(tmp_path):
    path, _ = _training_file(tmp_path)
    config = RemediationConfig(path, settings=TrainSettings(method="focal-distillation", epochs=1))
    with pytest.raises(UsageError, match="there is none"):
        train_ensemble(config, None, quiet=True)

    def broken(samples):
        raise KeyError("petal_width")

    with pytest.raises(ModelError, match=r"could not score the training samples \(.*train.csv\): KeyError"):
        train_ensemble(config, None, quiet=True, teacher=broken)
    with pytest.raises(ModelError, match="share none with the training classes"):
        train_ensemble(config, None, quiet=True, teacher=lambda s: pd.DataFrame({"x": [1.0] * len(s)}))


def test_the_python_api_takes_the_distillation_block_as_a_dict():
    """build_ensemble's settings are named as in the config; a distillation dict sets the keys it names
    over the method's default term, and an unknown key is refused by name."""
    from consistency_gate.ensembles.config import train_settings

    term = train_settings(method="ensemble-distillation", distillation={"loss": "lm", "clip": 0}).distillation_term
    assert term == Distillation(loss="lm", beta=0.0, clip=None)
    with pytest.raises(UsageError, match="unknown distillation setting 'temp'; the settings are loss, alpha"):
        train_settings(method="focal-distillation", distillation={"temp": 4})
