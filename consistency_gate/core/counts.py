"""Mergeable counts behind every consistency metric.

Every consistency metric is a ratio of additive counts (Pearson and cosine are sums
of per-sample values), so one :class:`ConsistencyCounts` can be fed batch by batch with
:meth:`~ConsistencyCounts.update`, and partial counts from other workers folded in with
:meth:`~ConsistencyCounts.merge`. One array, a stream of chunks and a map-reduce all give
the same numbers.

>>> import numpy as np
>>> prev = Outputs.from_scores(np.array([[0.9, 0.1], [0.4, 0.6]]), columns=[0, 1], k_max=2)
>>> cand = Outputs.from_labels(np.array([0, 0]))
>>> counts = ConsistencyCounts(ks=(1, 2)).update(np.array([0, 1]), prev, cand)
>>> values, reasons = counts.compute()
>>> values["con"], values["ctoi"], values["pearson"]
(0.5, 0.5, None)
>>> reasons["pearson"]
'the candidate gave hard labels, not class scores'
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields

import numpy as np

from consistency_gate.core import intervals as ci
from consistency_gate.core import rows
from consistency_gate.core.names import FLIP_NAMES

ROLES = ("previous", "candidate")


@dataclass(frozen=True)
class Outputs:
    """One generation's outputs on a batch, in a class-id space shared by all generations.

    ``labels`` are predicted class ids; ``top`` the k_max best class ids, best first;
    ``scores`` the raw score matrix in the generation's own column order and ``columns``
    the class id of each of its columns. Hard-label outputs have only ``labels``.
    """

    labels: np.ndarray
    top: np.ndarray | None = None
    scores: np.ndarray | None = None
    columns: np.ndarray | None = None

    @classmethod
    def from_scores(cls, scores: np.ndarray, columns: np.ndarray | list[int], k_max: int) -> Outputs:
        """Outputs from an (n, p) score matrix whose column j holds class id ``columns[j]``."""
        columns = np.asarray(columns, dtype=np.int64)
        top = _classes(rows.top_k(scores, k_max), columns)
        return cls(labels=top[:, 0], top=top, scores=scores, columns=columns)

    @classmethod
    def pair_from_scores(
        cls, previous: np.ndarray, candidate: np.ndarray, columns: np.ndarray | list[int], k_max: int
    ) -> tuple[Outputs, Outputs, tuple[np.ndarray, ...]]:
        """Both generations' outputs from (n, p) score matrices over the same ``columns``, and the
        pair's per-row sums behind Pearson and cosine (:func:`~consistency_gate.core.rows.row_moments`),
        in one pass over each row pair; :meth:`ConsistencyCounts.sample_values` takes the sums.

        >>> prev, cand, moments = Outputs.pair_from_scores(np.array([[0.9, 0.1]]), np.array([[0.3, 0.7]]), [0, 1], 1)
        >>> prev.labels.tolist(), cand.labels.tolist(), len(moments)
        ([0], [1], 5)
        """
        columns = np.asarray(columns, dtype=np.int64)
        top_a, top_b, moments = rows.pair_top_k(previous, candidate, k_max)
        outputs = tuple(
            cls(labels=top[:, 0], top=top, scores=scores, columns=columns)
            for top, scores in ((_classes(top_a, columns), previous), (_classes(top_b, columns), candidate))
        )
        return outputs[0], outputs[1], moments

    @classmethod
    def from_labels(cls, labels: np.ndarray) -> Outputs:
        """Outputs from hard predicted class ids."""
        return cls(labels=np.asarray(labels, dtype=np.int64))

    @property
    def has_scores(self) -> bool:
        """Whether these outputs carry class scores (not only hard labels)."""
        return self.scores is not None


def _classes(top: np.ndarray, columns: np.ndarray) -> np.ndarray:
    """Top lists of column indices as class ids (column j holds class ``columns[j]``)."""
    return top if np.array_equal(columns, np.arange(columns.size)) else columns[top]


def _state(default: object = 0, merge: str = "sum") -> object:
    """A counting state and how two parts of it merge (as torchmetrics' ``add_state``):
    ``sum`` adds, ``sum_per_k`` adds per k, ``same`` must agree (None: not seen yet)."""
    if merge == "sum_per_k":
        return field(default_factory=dict, metadata={"merge": merge})
    return field(default=default, metadata={"merge": merge})


@dataclass
class ConsistencyCounts:
    """Additive counts for one (previous, candidate) pair; see the module docstring.

    Every field but ``ks`` is a state that declares its merge (:func:`_state`); :meth:`merge`
    follows the declarations, so a new state cannot be dropped by a merge.
    """

    ks: tuple[int, ...] = (1,)
    n: int = _state()
    correct_previous: int = _state()
    correct_candidate: int = _state()
    agree: int = _state()
    ctoc: int = _state()
    ctoi: int = _state()
    itoc: int = _state()
    itoi: int = _state()
    unknown_previous: int = _state()
    unknown_candidate: int = _state()
    ccon: dict[int, int] = _state(merge="sum_per_k")
    cacc_previous: dict[int, int] = _state(merge="sum_per_k")
    cacc_candidate: dict[int, int] = _state(merge="sum_per_k")
    pearson_sum: float = _state(0.0)
    pearson_sq: float = _state(0.0)  # sum of squares: the interval of the mean
    pearson_n: int = _state()
    cosine_sum: float = _state(0.0)
    cosine_sq: float = _state(0.0)
    cosine_n: int = _state()
    same_scores: int = _state()  # samples whose two score vectors are equal: a baseline gated against itself
    previous_has_scores: bool | None = _state(None, merge="same")
    candidate_has_scores: bool | None = _state(None, merge="same")

    def __post_init__(self) -> None:
        self.ks = tuple(sorted(set(self.ks)))
        if not self.ks or self.ks[0] < 1:
            raise ValueError(f"every k must be >= 1, got {self.ks}")
        for counter in (self.ccon, self.cacc_previous, self.cacc_candidate):
            for k in self.ks:
                counter.setdefault(k, 0)

    @property
    def k_max(self) -> int:
        """The largest k counted."""
        return self.ks[-1]

    def update(
        self,
        y_true: np.ndarray,
        previous: Outputs,
        candidate: Outputs,
        moments: tuple[np.ndarray, ...] | None = None,
    ) -> ConsistencyCounts:
        """Add one batch (true class ids and both generations' outputs, and the pair's per-row sums
        where :meth:`Outputs.pair_from_scores` gave them); returns self."""
        values = self.sample_values(y_true, previous, candidate, moments)
        return self.add_values(values, (previous.has_scores, candidate.has_scores))

    def add_values(self, values: Mapping[str, np.ndarray], kinds: tuple[bool, bool]) -> ConsistencyCounts:
        """Add a batch's per-sample values (:meth:`sample_values`) of generations that gave scores or
        not (``kinds``); returns self."""
        totals = {key: np.count_nonzero(v) if v.dtype == bool else v.sum() for key, v in values.items()}
        return self.add(totals, len(values["ctoc"]), kinds)

    def sample_values(
        self,
        y_true: np.ndarray,
        previous: Outputs,
        candidate: Outputs,
        moments: tuple[np.ndarray, ...] | None = None,
    ) -> dict[str, np.ndarray]:
        """Each additive state's per-sample values on one batch, keyed by state name (``name@k``
        for per-k states). Their sums are :meth:`update`'s totals; their sums per slice value are
        :class:`~consistency_gate.core.slices.SliceCounts`' (one definition of every count).
        ``moments``: the pair's per-row sums (:meth:`Outputs.pair_from_scores`), or None to compute them.

        >>> previous, candidate = Outputs.from_labels(np.array([0, 0])), Outputs.from_labels(np.array([0, 1]))
        >>> values = ConsistencyCounts().sample_values(np.array([0, 1]), previous, candidate)
        >>> values["itoc"].tolist(), values["agree"].tolist()
        ([False, True], [True, False])
        """
        y_true = np.asarray(y_true, dtype=np.int64)
        generations = dict(zip(ROLES, (previous, candidate), strict=True))
        table = rows.pair_indicators(y_true, *(self._top(role, out) for role, out in generations.items()), self.ks)
        head, tail = table[: len(rows.INDICATORS)], table[len(rows.INDICATORS) :]
        values: dict[str, np.ndarray] = dict(zip(rows.INDICATORS, head, strict=True))
        # then per k: CACC-k of the previous generation, of the candidate, and CCON-k
        per_k = dict(zip(("cacc_previous", "cacc_candidate", "ccon"), np.split(tail, 3), strict=True))
        scored = [role for role, out in generations.items() if out.top is not None]
        for name in [f"cacc_{role}" for role in scored] + (["ccon"] if len(scored) == 2 else []):
            values.update({f"{name}@{k}": row for k, row in zip(self.ks, per_k[name], strict=True)})
        if len(scored) < 2 and 1 in self.ks:  # a hard label's top-1 consistency is agreement
            values["ccon@1"] = values["agree"]
        values["unknown_previous"] = _unknown(y_true, previous)
        values["unknown_candidate"] = _unknown(y_true, candidate)
        if previous.has_scores and candidate.has_scores:
            values.update(_similarity_values(previous, candidate, moments))
        return values

    def add(self, totals: Mapping[str, float], n: int, kinds: tuple[bool, bool]) -> ConsistencyCounts:
        """Add ``n`` samples' totals (state name or ``name@k`` -> total, as :meth:`sample_values`
        keys them) of a batch whose generations gave scores or not (``kinds``); returns self."""
        self._check_kind("previous", kinds[0])
        self._check_kind("candidate", kinds[1])
        self.n += n
        for key, total in totals.items():
            name, _, k = key.partition("@")
            if k:
                getattr(self, name)[int(k)] += int(round(total))
            elif isinstance(getattr(self, name), float):
                setattr(self, name, getattr(self, name) + float(total))
            else:
                setattr(self, name, getattr(self, name) + int(round(total)))
        return self

    @property
    def flip_counts(self) -> tuple[int, int, int, int]:
        """The 2x2 right/wrong table: (CtoC, CtoI, ItoC, ItoI) counts."""
        return self.ctoc, self.ctoi, self.itoc, self.itoi

    def _check_kind(self, role: str, has_scores: bool) -> None:
        attr = f"{role}_has_scores"
        known = getattr(self, attr)
        if known is None:
            setattr(self, attr, has_scores)
        elif known != has_scores:
            raise ValueError(f"the {role} generation mixes score batches and hard-label batches")

    def _top(self, role: str, out: Outputs) -> np.ndarray:
        """A generation's top list, k_max long; hard labels are a list of one."""
        if out.top is None:
            return out.labels[:, None]
        if out.top.shape[1] < self.k_max:
            raise ValueError(f"the {role} outputs hold the top {out.top.shape[1]}, need {self.k_max}")
        return out.top[:, : self.k_max]

    def merge(self, other: ConsistencyCounts) -> ConsistencyCounts:
        """A new ConsistencyCounts holding both sets of counts (map-reduce's reduce step)."""
        if self.ks != other.ks:
            raise ValueError(f"cannot merge counts for k={self.ks} with counts for k={other.ks}")
        out = ConsistencyCounts(ks=self.ks)
        for state in fields(self):
            if state.name == "ks":
                continue
            mine, theirs = getattr(self, state.name), getattr(other, state.name)
            merge = state.metadata["merge"]
            if merge == "sum":
                merged = mine + theirs
            elif merge == "sum_per_k":
                merged = {k: mine[k] + theirs[k] for k in self.ks}
            else:  # "same": one kind of output per generation
                kinds = {mine, theirs} - {None}
                if len(kinds) > 1:
                    role = state.name.removesuffix("_has_scores")
                    raise ValueError(f"cannot merge: the {role} generation has scores in one part only")
                merged = kinds.pop() if kinds else None
            setattr(out, state.name, merged)
        return out

    def compute(self) -> tuple[dict[str, float | None], dict[str, str]]:
        """Metric values keyed as ``compare --format json`` prints them, and the reason for each null value."""
        values: dict[str, float | None] = {}
        reasons: dict[str, str] = {}

        def ratio(key: str, num: float, den: float, why: str) -> None:
            values[key] = num / den if den else None
            if not den:
                reasons[key] = why

        empty = "no samples were evaluated"
        ratio("acc_previous", self.correct_previous, self.n, empty)
        ratio("acc_candidate", self.correct_candidate, self.n, empty)
        ratio("con", self.agree, self.n, empty)
        ratio("acc_con", self.ctoc, self.n, empty)
        for name, count in zip(FLIP_NAMES, self.flip_counts, strict=True):
            ratio(name, count, self.n, empty)
        ratio("com", self.ctoc + self.itoc - self.ctoi, self.n, empty)
        for key, num, den in (
            ("pearson", self.pearson_sum, self.pearson_n),
            ("cosine", self.cosine_sum, self.cosine_n),
        ):
            ratio(key, num, den, self._similarity_reason(key))
        ratio(
            "btc",
            self.ctoc,
            self.correct_previous,
            "the previous generation got no sample right (BTC = CtoC / ACC_previous)",
        )
        ratio(
            "bec",
            self.itoi,
            self.n - self.correct_candidate,
            "the candidate got no sample wrong (BEC = ItoI / (1 - ACC_candidate))",
        )
        wrong_candidate = self.n - self.correct_candidate
        ratio(
            "rel_nfr",
            self.ctoi * self.n,
            self.correct_previous * wrong_candidate,
            "the previous generation got no sample right, or the candidate none wrong "
            "(rel_nfr = CtoI / (ACC_previous x (1 - ACC_candidate)))",
        )
        for k in self.ks:
            both = self.previous_has_scores and self.candidate_has_scores
            if k == 1 or both:
                ratio(f"ccon@{k}", self.ccon[k], self.n, empty)
            else:
                values[f"ccon@{k}"] = None
                reasons[f"ccon@{k}"] = f"top-{k} consistency needs class scores from both generations"
            for role, counter in (("previous", self.cacc_previous), ("candidate", self.cacc_candidate)):
                key = f"cacc_{role}@{k}"
                if getattr(self, f"{role}_has_scores"):
                    ratio(key, counter[k], self.n, empty)
                elif k == 1:
                    values[key] = values[f"acc_{role}"]
                else:
                    values[key] = None
                    reasons[key] = f"top-{k} accuracy needs class scores; the {role} gave hard labels"
        return values, reasons

    def intervals(self, level: float = 0.95, method: str = "wilson") -> dict[str, list[float]]:
        """``{key: [low, high]}`` at confidence ``level`` for every metric :meth:`compute` gives a
        value, from these counts alone (see :mod:`consistency_gate.core.intervals`); also
        ``acc_delta``, candidate ACC minus previous ACC (Newcombe's paired interval).

        >>> counts = ConsistencyCounts().update(np.array([0, 1, 1, 0]), *(Outputs.from_labels(np.array(p))
        ...     for p in ([0, 1, 0, 0], [0, 1, 1, 1])))
        >>> [round(v, 3) for v in counts.intervals()["con"]]
        [0.15, 0.85]
        """
        values, _ = self.compute()
        n = self.n
        counts: dict[str, tuple[int, int]] = {
            "acc_previous": (self.correct_previous, n),
            "acc_candidate": (self.correct_candidate, n),
            "con": (self.agree, n),
            "acc_con": (self.ctoc, n),
            "btc": (self.ctoc, self.correct_previous),
            "bec": (self.itoi, n - self.correct_candidate),
            **{name: (count, n) for name, count in zip(FLIP_NAMES, self.flip_counts, strict=True)},
        }
        for k in self.ks:
            counts[f"ccon@{k}"] = (self.ccon[k], n)
            counts[f"cacc_previous@{k}"] = (self.cacc_previous[k], n)
            counts[f"cacc_candidate@{k}"] = (self.cacc_candidate[k], n)
            if not self.previous_has_scores:  # top-1 of hard labels: the accuracy's own count
                counts[f"cacc_previous@{k}"] = (self.correct_previous, n)
            if not self.candidate_has_scores:
                counts[f"cacc_candidate@{k}"] = (self.correct_candidate, n)
        found: dict[str, tuple[float, float] | None] = {
            key: ci.proportion(k, total, level, method) for key, (k, total) in counts.items()
        }
        found["pearson"] = ci.mean_interval(self.pearson_sum, self.pearson_sq, self.pearson_n, level)
        found["cosine"] = ci.mean_interval(self.cosine_sum, self.cosine_sq, self.cosine_n, level)
        found["com"] = ci.com_interval(*self.flip_counts, level)
        found["rel_nfr"] = ci.rel_nfr_interval(*self.flip_counts, level)
        found["acc_delta"] = ci.newcombe_paired(*self.flip_counts, level)
        return {
            key: [float(low), float(high)]
            for key, bounds in found.items()
            if bounds is not None and (key == "acc_delta" or values.get(key) is not None)
            for low, high in [bounds]
        }

    @property
    def identical(self) -> bool:
        """Whether the two generations answered alike on every sample: the same label, and the same
        scores where both gave scores (the sign of a baseline gated against itself).

        >>> same = Outputs.from_labels(np.array([0, 1]))
        >>> ConsistencyCounts().update(np.array([0, 0]), same, same).identical
        True
        """
        scored = bool(self.previous_has_scores and self.candidate_has_scores)
        return self.n > 0 and self.agree == self.n and (not scored or self.same_scores == self.n)

    def bounds(self, level: float = 0.95) -> dict[str, list[float]]:
        """``{key: [lower, upper]}``, each a one-sided bound at ``level``: what a rule decided on a
        bound compares. They are the ends of the two-sided interval at ``2 * level - 1``, exact
        (Clopper-Pearson) for proportions, so a proportion exactly at a threshold passes a strict
        rule at most ``1 - level`` of the time.

        >>> counts = ConsistencyCounts().update(np.zeros(100, int), Outputs.from_labels(np.zeros(100, int)),
        ...     Outputs.from_labels(np.r_[np.ones(2, int), np.zeros(98, int)]))
        >>> [round(v, 4) for v in counts.bounds(0.95)["ctoi"]]
        [0.0036, 0.0616]
        """
        return self.intervals(ci.one_sided(level), "clopper-pearson")

    def tests(self) -> dict[str, float]:
        """``{"mcnemar_p": p}``: the exact two-sided McNemar test of CtoI against ItoC, "is the
        candidate's accuracy really different from the previous generation's?"."""
        return {"mcnemar_p": ci.mcnemar_exact(self.ctoi, self.itoc)}

    def _similarity_reason(self, key: str) -> str:
        for role in ROLES:
            if getattr(self, f"{role}_has_scores") is False:
                return f"the {role} gave hard labels, not class scores"
        if self.n == 0:
            return "no samples were evaluated"
        return f"{key} is undefined on every sample (a score vector is constant or all zero)"

    def unknown_labels(self) -> dict[str, int]:
        """Samples whose true class a generation does not know (counted as wrong for it)."""
        return {"previous": self.unknown_previous, "candidate": self.unknown_candidate}


def _on_classes(scores: np.ndarray, columns: np.ndarray, classes: np.ndarray) -> np.ndarray:
    """The score matrix laid out on ``classes`` (sorted ids), zeros where it has no column."""
    out = np.zeros((scores.shape[0], classes.size), dtype=scores.dtype)
    out[:, np.searchsorted(classes, columns)] = scores
    return out


def _unknown(y_true: np.ndarray, out: Outputs) -> np.ndarray:
    """Per sample: its true class is not a class of this generation's scores."""
    if out.columns is None:
        return np.zeros(y_true.size, dtype=bool)
    if y_true.size == 0 or y_true.min() < 0:
        return ~np.isin(y_true, out.columns)
    known = np.zeros(max(int(y_true.max()), int(out.columns.max(initial=0))) + 1, dtype=bool)
    known[out.columns] = True  # a look-up table of class ids: one gather, where isin sorts
    return ~known[y_true]


def _similarity_values(
    previous: Outputs, candidate: Outputs, moments: tuple[np.ndarray, ...] | None
) -> dict[str, np.ndarray]:
    """Per-sample Pearson and cosine of the two score vectors (0 and not counted where undefined),
    from the pair's per-row sums (computed here unless given)."""
    a, b = previous.scores, candidate.scores
    if not np.array_equal(previous.columns, candidate.columns):
        # over the union of both class sets; a class a generation lacks scores 0 there
        union = np.union1d(previous.columns, candidate.columns)
        a, b = _on_classes(a, previous.columns, union), _on_classes(b, candidate.columns, union)
        moments = None
    sum_a, sum_b, sq_a, sq_b, dot = rows.row_moments(a, b) if moments is None else moments
    r = rows.rowwise_pearson(sum_a, sum_b, sq_a, sq_b, dot, a.shape[1], rel_tol=rows.rounding_tolerance(a, b))
    c = rows.rowwise_cosine(sq_a, sq_b, dot)
    values = {}
    for name, per_row in (("pearson", r), ("cosine", c)):
        defined = ~np.isnan(per_row)
        values[f"{name}_sum"] = np.where(defined, per_row, 0.0)
        values[f"{name}_sq"] = np.where(defined, per_row * per_row, 0.0)
        values[f"{name}_n"] = defined
    values["same_scores"] = (sq_a == sq_b) & (dot == sq_a)  # |a - b|^2 = sq_a + sq_b - 2 dot = 0
    return values
