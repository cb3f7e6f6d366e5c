"""The metrics' names, as ``compare --format json`` keys them: one list that the counts
(:meth:`~consistency_gate.core.counts.ConsistencyCounts.compute`, held to it by a test), the gate's rules,
its config and the report schema (report/schema.py) read.

>>> PAIR_METRICS[:6]
('con', 'acc_con', 'ctoc', 'ctoi', 'itoc', 'itoi')
>>> bool(PER_K.match("cacc_candidate@5")), bool(PER_K.match("ctoi@5"))
(True, False)
"""

from __future__ import annotations

import re

FLIP_NAMES = ("ctoc", "ctoi", "itoc", "itoi")  # previous right/wrong -> candidate right/wrong
# each generation's own accuracy
LEARNER_METRICS = ("acc_previous", "acc_candidate")
# the two generations together
PAIR_METRICS = ("con", "acc_con", *FLIP_NAMES, "com", "pearson", "cosine", "btc", "bec", "rel_nfr")
# metrics that are a share of all evaluated samples (intervals: Wilson over n)
SHARES = (*LEARNER_METRICS, "con", "acc_con", *FLIP_NAMES)
# top-k metrics, one per k of the config's ks: ccon@K, cacc_previous@K, cacc_candidate@K (cacc@K in a rule)
PER_K = re.compile(r"^(ccon|cacc_previous|cacc_candidate|cacc)@([1-9][0-9]*)$")
# serving cost of what is gated relative to the candidate (mlops/cost.py): min/max on the estimate
COST_METRICS = ("latency_ratio", "size_ratio")
# measured over the model's champions (gate/history.py): a rule names how many with `history: K`
HISTORY_METRICS = ("forgotten", "cumulative_nfr")
# measured against a seed replica of the baseline (`floor:` / --floor)
FLOOR_METRICS = ("ctoi_excess", "floor_ctoi", "floor_con")
# every metric a report's ``metrics`` may hold (report/schema.py), besides the top-k metrics of PER_K
REPORTED = (*LEARNER_METRICS, *PAIR_METRICS, *COST_METRICS, *HISTORY_METRICS, *FLOOR_METRICS)


def score_roles(metric: str) -> tuple[str, ...]:
    """The generations that must give class scores for ``metric`` (as a rule names it) to have a value: both for
    Pearson, cosine and top-k consistency beyond k = 1; the one measured for top-k accuracy beyond k = 1 (``cacc``
    alone: the candidate); none for the metrics of answers (a model of class labels has them all).

    >>> score_roles("pearson"), score_roles("cacc@5"), score_roles("cacc_previous@3"), score_roles("ccon@1")
    (('previous', 'candidate'), ('candidate',), ('previous',), ())
    """
    per_k = PER_K.match(metric)
    if metric in ("pearson", "cosine") or (per_k and per_k.group(1) == "ccon" and per_k.group(2) != "1"):
        return ("previous", "candidate")
    if per_k and per_k.group(2) != "1":
        return ("previous",) if per_k.group(1) == "cacc_previous" else ("candidate",)
    return ()
