"""The gate on prediction files: for pipelines that predict in a batch job and gate afterwards.

``consistency-gate check --labels F --previous-predictions F --candidate-predictions F`` applies
the same rules as the gate of registered models (:mod:`consistency_gate.gate.run`), prints the
same verdict, writes the same ``--report`` and exits with the same codes, without a model registry.
With a tracking URI (``--tracking-uri`` or ``$MLFLOW_TRACKING_URI``) it logs the same run, in the
experiment ``consistency-gate/<name>``; without one it logs nothing.

    result = run_file_gate("labels.csv", "gen1.parquet", "gen2.parquet", config="gate.yaml")
    result.verdict, result.exit_code
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from consistency_gate.core import names
from consistency_gate.core.evaluation import flip_table, inapplicable_ks
from consistency_gate.engines.local import evaluate_files
from consistency_gate.errors import UsageError
from consistency_gate.gate import config as gate_config
from consistency_gate.gate.decision import Decision
from consistency_gate.gate.result import GateResult
from consistency_gate.gate.session import GateSession
from consistency_gate.io import predictions as io
from consistency_gate.mlops import tracking

DEFAULT_NAME = "predictions"


def run_file_gate(
    labels: str | Path,
    previous: str | Path,
    candidate: str | Path,
    *,
    name: str = DEFAULT_NAME,
    label_column: str = "label",
    id_column: str | None = None,
    config: str | Path | gate_config.GateConfig | None = None,
    tracking_uri: str | None = None,
    report_path: str | Path | None = None,
    html: bool = False,
) -> GateResult:
    """Gate the candidate's prediction file against the previous generation's (files as
    ``compare`` reads them); see the module docstring.

    ``tracking_uri`` None means ``$MLFLOW_TRACKING_URI``, and no run at all when that is unset.
    The HTML report (``result.html``) is made when a run logs it, or when ``html`` asks for it.
    A config with a ``remediation:`` block, or a rule on serving cost, is refused (exit 2):
    both need models, and prediction files have none.

    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> _ = (folder / "labels.csv").write_text("label\\na\\nb\\nb\\n")
    >>> _ = (folder / "gen1.csv").write_text("prediction\\na\\nb\\na\\n")
    >>> _ = (folder / "gen2.csv").write_text("prediction\\na\\na\\nb\\n")
    >>> cfg = gate_config.parse_config("rules:\\n  - {metric: ctoi, max: 0.1}\\nks: [1]\\n")
    >>> store = f"sqlite:///{folder / 'mlflow.db'}"
    >>> files = folder / "labels.csv", folder / "gen1.csv", folder / "gen2.csv"
    >>> result = run_file_gate(*files, name="nightly", config=cfg, tracking_uri=store)
    >>> result.verdict, result.exit_code, round(result.metrics["ctoi"], 4), result.run_id is not None
    ('failed', 1, 0.3333, True)
    """
    with GateSession(report_path) as session:
        cfg = config if isinstance(config, gate_config.GateConfig) else gate_config.load_config(config)
        _refuse_model_work(cfg)
        uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or None
        if uri:  # before any work: an unreachable server is exit 5 at once
            session.connect(uri)
        files = Path(labels), Path(previous), Path(candidate)
        decision = _decide(*files, cfg, label_column, id_column, flips=bool(uri) or html)
        result = GateResult.of(
            decision,
            candidate={"name": name, "version": None, "predictions": str(candidate)},
            baseline={"name": name, "version": None, "predictions": str(previous)},
        )
        if uri:
            session.start(tracking.experiment_name(name), f"gate {name} (prediction files)", owner=name)
            result.run_id = session.run_id
            _log_run(result, decision, cfg, session, Path(labels))
        elif html:
            result.html = decision.html(result.to_dict())
        return session.finish(result)


def _refuse_model_work(cfg: gate_config.GateConfig) -> None:
    """UsageError for what needs models, which prediction files have none of: remediation, cost rules."""
    if cfg.remediation is not None:
        raise UsageError(
            f"{cfg.source}: remediation trains and registers models, and gating prediction files has none: "
            "remove the remediation block, or gate registered models with --model and --data"
        )
    costly = [r.metric for r in cfg.rules if r.metric in names.COST_METRICS]
    if costly:
        raise UsageError(
            f"{cfg.source}: a rule on {costly[0]} needs models to time and measure, and prediction files have "
            "none: remove it, or gate registered models with --model and --data"
        )


def _decide(
    labels: Path,
    previous: Path,
    candidate: Path,
    cfg: gate_config.GateConfig,
    label_column: str,
    id_column: str | None,
    flips: bool,
) -> Decision:
    """Stream the three files through the metrics and judge; with ``flips``, keep each sample for
    the flip table (logged, and drawn in the HTML report; a gate that does neither skips it: 0.6 s
    of 2.6 at 400,000 rows). A ``decision:`` block must name its positive class: a file's column order
    says nothing."""
    if cfg.decision is not None and cfg.decision.positive is None:
        raise UsageError(
            f"{cfg.source}: decision: names no positive class, and prediction files do not say which class is "
            "positive (their columns are read in any order): add `positive: <class>` to the block"
        )
    files = {"previous": previous, "candidate": candidate}
    evaluation = evaluate_files(
        labels,
        files,
        label_column=label_column,
        id_column=id_column,
        ks=cfg.ks,
        slices=cfg.slices,
        keep_samples=flips,
        ks_from=f"{cfg.source}: the rules need k",
        needed_ks=cfg.rule_ks,
        decision=cfg.decision,
    )
    comparison = evaluation.result(confidence=cfg.confidence, interval_method=cfg.interval_method)
    comparison.add(inapplicable_ks(cfg.ks, {str(files[name]): width for name, width in evaluation.widths.items()}))
    samples = pd.DataFrame()
    if flips:
        ids = io.read_column(labels, id_column).to_numpy() if id_column else np.arange(comparison.n)
        samples = flip_table(evaluation.samples(), ids)
    return Decision.judge(comparison, cfg, samples, evaluation.ks)


def _log_run(
    result: GateResult, decision: Decision, cfg: gate_config.GateConfig, session: GateSession, labels: Path
) -> None:
    """The gate's run in ``consistency-gate/<name>``: params, the decision and the verdict."""
    import mlflow

    mlflow.log_params(
        {
            "source": "prediction files",
            "labels": str(labels),
            "previous_predictions": result.baseline["predictions"],
            "candidate_predictions": result.candidate["predictions"],
            "n_rows": result.n,
            "config": cfg.source,
        }
    )
    tracking.log_json([{"metric": r.metric, r.kind: r.threshold} for r in cfg.rules], "gate/config.json")
    result.links = tracking.ui_links(session.uri, session.experiment_id, session.run_id)
    decision.log()
    session.log_verdict(result, decision)
