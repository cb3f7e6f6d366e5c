"""Logging a gate run to MLflow so a reviewer can read it in the MLflow UI."""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import socket
import tempfile
import time
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from collections.abc import Iterator

    from mlflow import MlflowClient
    from mlflow.data.dataset import Dataset

EXPERIMENT_PREFIX = "consistency-gate"


def experiment_name(model: str) -> str:
    """The experiment a model's gate runs go to: ``consistency-gate/NAME``.

    >>> experiment_name("fraud-clf")
    'consistency-gate/fraud-clf'
    """
    return f"{EXPERIMENT_PREFIX}/{model}"


def experiment_id(name: str, tracking_uri: str) -> str:
    """The id of experiment ``name``, created if needed; the active experiment is left as it is.

    On a local SQLite store, a new experiment keeps its artifacts in ``mlartifacts/`` beside
    the database file (MLflow's default would be the current directory).

    Example::

        experiment_id("consistency-gate/fraud-clf", "sqlite:///mlflow.db")
        # '1'
    """
    import mlflow
    from mlflow.exceptions import MlflowException

    experiment = mlflow.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    location = None
    if tracking_uri.startswith("sqlite:///"):
        folder = Path(tracking_uri.removeprefix("sqlite:///")).expanduser().resolve().parent
        location = (folder / "mlartifacts").as_uri()
    try:
        return mlflow.create_experiment(name, artifact_location=location)
    except MlflowException as exc:  # gates started together: another one created it first
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
        return mlflow.get_experiment_by_name(name).experiment_id


def use_experiment(name: str, tracking_uri: str) -> None:
    """Make ``name`` the active experiment, creating it as :func:`experiment_id` does.

    Example::

        use_experiment("consistency-gate/fraud-clf", "sqlite:///mlflow.db")
    """
    import mlflow

    mlflow.set_experiment(experiment_id=experiment_id(name, tracking_uri))


def mlflow_metric_name(key: str) -> str:
    """MLflow metric names cannot hold '@': ``ccon@5`` is logged as ``ccon_at_5``.

    >>> mlflow_metric_name("ccon@5")
    'ccon_at_5'
    """
    return key.replace("@", "_at_")


def log_metrics(
    metrics: dict[str, float | None], prefix: str = "", model_id: str | None = None, dataset: Dataset | None = None
) -> None:
    """Log the non-null metrics to the active run (``@`` written as ``_at_``); with ``model_id``
    (and ``dataset``) they are linked to that MLflow 3 logged model too, so its model page shows
    them, measured on that dataset.

    Example::

        log_metrics({"con": 0.97, "ccon@5": 0.99, "pearson": None})  # logs con and ccon_at_5
    """
    import mlflow

    values = {prefix + mlflow_metric_name(k): float(v) for k, v in metrics.items() if v is not None}
    mlflow.log_metrics(values, model_id=model_id, dataset=dataset if model_id else None)


def ui_links(tracking_uri: str, experiment_id: str, run_id: str, model: str = "", versions: dict | None = None) -> dict:
    """Links into the MLflow UI for a report: the run and each named model version (``versions``:
    ``{role: version}``, None skipped); empty unless the tracking URI is http(s), the one kind of
    store a browser opens. Credentials in the URI are left out.

    >>> links = ui_links("https://bob:pw@mlflow.example.com/", "7", "abc", "clf", {"candidate": "3", "baseline": None})
    >>> links["run"], links["candidate"]
    ('https://mlflow.example.com/#/experiments/7/runs/abc?workflowType=machine_learning', 'https://mlflow.example.com/#/models/clf/versions/3')
    >>> ui_links("sqlite:///mlflow.db", "7", "abc")
    {}
    """
    from urllib.parse import quote, urlsplit

    parts = urlsplit(tracking_uri)
    if parts.scheme not in ("http", "https"):
        return {}
    base = f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}{parts.path.rstrip('/')}"
    links = {"run": run_page(base, experiment_id, run_id)}
    for role, version in (versions or {}).items():
        if version is not None:
            links[role] = f"{base}/#/models/{quote(model, safe='')}/versions/{version}"
    return links


# the MLflow UI (3.x) opens in its GenAI view unless a page asks for the model-training one
UI_VIEW = "?workflowType=machine_learning"


def run_page(ui: str, experiment_id: str, run_id: str) -> str:
    """The address of a run's page in the MLflow UI at ``ui``, in the model-training view.

    >>> run_page("http://127.0.0.1:5000", "1", "abc")
    'http://127.0.0.1:5000/#/experiments/1/runs/abc?workflowType=machine_learning'
    """
    return f"{ui}/#/experiments/{experiment_id}/runs/{run_id}{UI_VIEW}"


def describe_run(markdown: str) -> None:
    """Set the active run's description (shown on its page in the MLflow UI).

    Example::

        with mlflow.start_run():
            describe_run(verdict_markdown(report))
    """
    import mlflow

    mlflow.set_tag("mlflow.note.content", markdown)


_BATCH: contextvars.ContextVar[list[tuple[str, str, bytes]] | None] = contextvars.ContextVar("uploads", default=None)
UPLOADS_AT_ONCE = 8


@contextlib.contextmanager
def uploads() -> Iterator[None]:
    """Within this block, the artifacts logged to the active run are gathered and uploaded together when it ends,
    several at a time: a tracking server answers each upload in tens of milliseconds, and a gate's dozen, one
    after another, were half a second of a listener's gate. A failed upload raises at the block's end (nothing
    after the block, an alias move least of all, happens without its artifacts); a block that raises uploads
    nothing more.

    Example::

        with uploads():
            log_json(report, "gate/report.json")
            log_html(page, "gate/report.html")
    """
    batch: list[tuple[str, str, bytes]] = []
    token = _BATCH.set(batch)
    try:
        yield
    finally:
        _BATCH.reset(token)
    if batch:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(min(UPLOADS_AT_ONCE, len(batch)), thread_name_prefix="consistency-gate-upload") as pool:
            for done in [pool.submit(_upload, *item) for item in batch]:
                done.result()


def log_bytes(data: bytes, artifact_file: str) -> None:
    """Log ``data`` as the artifact ``artifact_file`` of the active run (with the others of an :func:`uploads`
    block, when in one).

    Example::

        log_bytes(png, "gate/plots/topk_curve.png")
    """
    import mlflow

    run_id = mlflow.active_run().info.run_id
    batch = _BATCH.get()
    if batch is None:
        _upload(run_id, artifact_file, data)
    else:
        batch.append((run_id, artifact_file, data))


def _upload(run_id: str, artifact_file: str, data: bytes) -> None:
    from mlflow import MlflowClient

    folder, _, name = artifact_file.rpartition("/")
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / name).write_bytes(data)
        MlflowClient().log_artifact(run_id, str(Path(tmp) / name), folder or None)


def log_text(text: str, artifact_file: str) -> None:
    """Log ``text`` (UTF-8) as the artifact ``artifact_file`` of the active run.

    Example::

        log_text("- the candidate flips 4% of the answers", "gate/diagnose.md")
    """
    log_bytes(text.encode("utf-8"), artifact_file)


def log_json(payload: object, artifact_file: str) -> None:
    """Log ``payload`` as a JSON artifact of the active run.

    Example::

        log_json({"verdict": "passed"}, "gate/report.json")
    """
    log_text(json.dumps(payload, indent=2, default=str), artifact_file)


def log_html(page: str, artifact_file: str) -> None:
    """Log an HTML page as an artifact of the active run (the MLflow UI shows it in place).

    Example::

        log_html(result.html, "gate/report.html")
    """
    log_text(page, artifact_file)


def log_intervals(intervals: dict[str, list[float]], tests: dict[str, float]) -> None:
    """Log each metric's interval bounds and the paired test as run metrics: ``interval/ctoi_low``,
    ``interval/ctoi_high``, ``test/mcnemar_p`` (the MLflow UI groups them by prefix).

    Example::

        log_intervals({"ctoi": [0.01, 0.03]}, {"mcnemar_p": 0.2})
    """
    import mlflow

    bounds = {
        f"interval/{mlflow_metric_name(key)}_{side}": float(value)
        for key, pair in intervals.items()
        for side, value in zip(("low", "high"), pair, strict=True)
    }
    mlflow.log_metrics({**bounds, **{f"test/{k}": float(v) for k, v in tests.items()}})


def slice_table(slices: list[dict]) -> pd.DataFrame:
    """One row per slice: column, value, n, then each metric and its interval's bounds
    (``ctoi``, ``ctoi_low``, ``ctoi_high``).

    >>> row = {"column": "region", "value": "eu", "n": 40, "metrics": {"ctoi": 0.05}}
    >>> slice_table([{**row, "intervals": {"ctoi": [0.01, 0.16]}}]).columns.tolist()
    ['slice', 'value', 'n', 'ctoi', 'ctoi_low', 'ctoi_high']
    """
    rows = []
    for s in slices:
        row = {"slice": s["column"], "value": s["value"], "n": s["n"]}
        for key, value in s["metrics"].items():
            low, high = s["intervals"].get(key, (None, None))
            row.update({key: value, f"{key}_low": low, f"{key}_high": high})
        rows.append(row)
    return pd.DataFrame(rows)


_TABLES: OrderedDict[str, list[dict]] = OrderedDict()  # run id -> its tables (MLflow's mlflow.loggedArtifacts tag)


def log_table(frame: pd.DataFrame, artifact_file: str) -> None:
    """Log ``frame`` as a table of the active run, as ``mlflow.log_table`` writes one (JSON in pandas' split
    orient, listed in the run's ``mlflow.loggedArtifacts`` tag, so the MLflow UI shows it as a table), in one
    upload and one tag: MLflow's own lists the run's artifacts and reads the run first (five requests more, each
    tens of milliseconds on a tracking server). A gate logs each table once.

    Example::

        log_table(pd.DataFrame(rule_rows), "gate/rules.json")
    """
    import mlflow
    from mlflow.utils.mlflow_tags import MLFLOW_LOGGED_ARTIFACTS

    run_id = mlflow.active_run().info.run_id
    log_text(frame.to_json(orient="split", index=False, date_format="iso"), artifact_file)
    tables = _TABLES.setdefault(run_id, [])
    if {"path": artifact_file, "type": "table"} not in tables:
        tables.append({"path": artifact_file, "type": "table"})
        mlflow.set_tag(MLFLOW_LOGGED_ARTIFACTS, json.dumps(tables))
    while len(_TABLES) > 100:  # a process that gates again and again keeps its recent runs' lists only
        _TABLES.popitem(last=False)


def log_slices(slices: list[dict]) -> None:
    """Log the per-slice table (``gate/slices.json``, a table in the MLflow UI).

    Example::

        log_slices(result.slices)
    """
    log_table(slice_table(slices), "gate/slices.json")


def log_rules(rule_rows: list[dict]) -> None:
    """Log the rule table (``gate/rules.json``, shown as a table in the MLflow UI).

    Example::

        log_rules([r.record() for r in decision.rules])
    """
    log_table(pd.DataFrame(rule_rows), "gate/rules.json")


LEDGER = "gate/answers.parquet"  # the per-sample answers of both generations, read by `history`


def log_samples(samples: pd.DataFrame) -> None:
    """The flip table as ``gate/flips.json`` (raw values, in the samples' order) and ``gate/flips.csv``
    (spreadsheet-safe, in the order a reviewer reads it: :func:`review_order`), and the ledger
    ``gate/answers.parquet``: each sample's id, label and both generations' answers, as text.

    Example::

        log_samples(flip_table(evaluation.samples(), ids))
    """

    log_table(samples.reset_index(drop=True), "gate/flips.json")
    log_text(spreadsheet_safe(review_order(samples)).to_csv(index=False), "gate/flips.csv")
    if len(samples):
        ledger = samples[["id", "label", "previous_prediction", "candidate_prediction"]].astype(str)
        ledger.columns = ["id", "label", "previous", "candidate"]
        log_bytes(ledger.reset_index(drop=True).to_parquet(index=False), LEDGER)


FLIP_ORDER = ("CtoI", "ItoC", "ItoI", "CtoC")  # negative flips first, the answers that did not change last


def review_order(samples: pd.DataFrame) -> pd.DataFrame:
    """A flip table as a reviewer reads it: the flip column first, negative flips (CtoI) first, then
    positive flips, both wrong, both right; the samples' own order within each kind.

    >>> table = pd.DataFrame({"id": ["a", "b", "c"], "label": ["x", "x", "y"], "flip": ["CtoC", "CtoI", "ItoC"]})
    >>> review_order(table).to_dict("list")
    {'flip': ['CtoI', 'ItoC', 'CtoC'], 'id': ['b', 'c', 'a'], 'label': ['x', 'y', 'x']}
    """
    if "flip" not in samples.columns:
        return samples
    rank = samples["flip"].map({kind: i for i, kind in enumerate(FLIP_ORDER)}).fillna(len(FLIP_ORDER))
    ordered = samples.iloc[np.argsort(rank.to_numpy(), kind="stable")]
    return ordered[["flip", *[c for c in samples.columns if c != "flip"]]]


_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_safe(frame: pd.DataFrame) -> pd.DataFrame:
    """A copy whose text cells cannot run as spreadsheet formulas: a cell starting with = + - @, tab
    or carriage return gets a leading ``'`` (OWASP's advice against CSV injection).

    >>> spreadsheet_safe(pd.DataFrame({"id": ["=HYPERLINK(1)", "s1"], "n": [1, -2]}))["id"].tolist()
    ["'=HYPERLINK(1)", 's1']
    """
    out = frame.copy()
    for name in out.columns:
        if out[name].dtype == object or pd.api.types.is_string_dtype(out[name].dtype):
            out[name] = out[name].astype(object).map(_neutralised)
    return out


def _neutralised(value: object) -> object:
    return "'" + value if isinstance(value, str) and value.startswith(_FORMULA_START) else value


def log_pngs(pngs: dict[str, bytes], artifact_path: str) -> None:
    """Log PNG images (``{file name: bytes}``) under ``artifact_path``.

    Example::

        log_pngs(gate_pngs(samples, counts.flip_counts, metrics, ks=[1, 5]), "gate/plots")
    """
    for name, png in pngs.items():
        log_bytes(png, f"{artifact_path}/{name}")


TAG_HOST = "consistency_gate.host"
TAG_PID = "consistency_gate.pid"
TAG_ERROR = "consistency_gate.error"
TAG_SESSION = "consistency_gate.session"  # one gate's runs: finds a run whose create response was lost
TAG_STARTED_BY = "consistency_gate.started_by"  # a gate the registry's event started (consistency-gate watch)
STARTED_BY_ENV = "CONSISTENCY_GATE_STARTED_BY"  # what started the gate, when not a person or a CI step
TAG_LEASE = "consistency_gate.lease"  # a gate a listener started: the lease generation it held (mlops/lease.py)
LEASE_ENV = "CONSISTENCY_GATE_LEASE"  # how a listener hands its gate that generation
# a gate run RUNNING this long is taken as orphaned even when its process cannot be checked
ORPHAN_AFTER_S = 24 * 3600


# the tags a reviewer reads first, set "pending" when a gate run starts so the MLflow UI (which
# lists a run's tags in the order they were first set) shows them before the owner tags
VERDICT_TAGS = (
    "consistency_gate.verdict", "consistency_gate.failed_rules", "consistency_gate.outcome",
    "consistency_gate.candidate_verdict",
)  # fmt: skip
PENDING = "pending"


def pending_tags() -> dict[str, str]:
    """The verdict tags of a gate run that has not decided yet (an error sets them to ``error``).

    >>> list(pending_tags())[0]
    'consistency_gate.verdict'
    """
    return dict.fromkeys(VERDICT_TAGS, PENDING)


def started_by_tags() -> dict[str, str]:
    """The tags that say what started a gate (:data:`STARTED_BY_ENV`, set by ``consistency-gate watch``) and the lease
    generation of the listener that started it (:data:`LEASE_ENV`), where set."""
    started, lease = os.environ.get(STARTED_BY_ENV), os.environ.get(LEASE_ENV)
    return {**({TAG_STARTED_BY: started[:500]} if started else {}), **({TAG_LEASE: lease} if lease else {})}


def owner_tags(session: str) -> dict[str, str]:
    """Tags that say which process and gate ``session`` run a gate run, set when the run is created,
    so a later gate can tell an orphan and this gate can find a run whose create response was lost.

    >>> sorted(owner_tags("3f2a"))
    ['consistency_gate.host', 'consistency_gate.pid', 'consistency_gate.session']
    """
    return {TAG_HOST: socket.gethostname(), TAG_PID: str(os.getpid()), TAG_SESSION: session}


def close_lost_runs(client: MlflowClient, experiment_id: str, session: str, known: list[str]) -> list[str]:
    """Mark FAILED the RUNNING runs of gate ``session`` that it does not know it started (``known``):
    runs whose create request reached the server while its response was lost (a retried create
    made a second one). Returns their ids; an unreachable server leaves them to the orphan cleanup.

    Example::

        close_lost_runs(client, experiment_id, session, known=[run_id])
        # ['9c1b...']
    """
    query = f"tags.`{TAG_SESSION}` = '{session}' and attributes.status = 'RUNNING'"
    try:
        runs = client.search_runs([experiment_id], filter_string=query, max_results=50)
    except Exception:  # noqa: BLE001 - the server may be what lost the response: leave them to the next gate
        return []
    lost = [run.info.run_id for run in runs if run.info.run_id not in known]
    why = f"lost: gate session {session} created it but never heard back (a lost response); closed by that gate"
    return [run_id for run_id in lost if run_id not in close_runs(client, [run_id], "FAILED", why, 0)]


def close_runs(client: MlflowClient, run_ids: list[str], status: str, why: str | None, budget_s: float) -> list[str]:
    """Set each run's final status (tagging ``why``, the error, if given), retrying for ``budget_s``
    seconds while the tracking server is away; returns the ids that could not be closed (left RUNNING).

    Example::

        close_runs(client, [run_id], "FAILED", "ValueError: ...", budget_s=30)
        # []
    """
    left = list(run_ids)
    deadline = time.monotonic() + budget_s
    pause = 0.5
    while left:
        for run_id in list(left):
            try:
                run = client.get_run(run_id)
                pending = [key for key in VERDICT_TAGS if run.data.tags.get(key) == PENDING]
                if run.info.status == "RUNNING" or (status == "FAILED" and pending):  # ended by MLflow's own end_run
                    if why is not None:
                        client.set_tag(run_id, TAG_ERROR, why[:500])
                    for key in pending:  # a gate that never decided: its verdict is the error
                        client.set_tag(run_id, key, "error")
                if run.info.status == "RUNNING":
                    client.set_terminated(run_id, status)
                left.remove(run_id)
            except Exception:  # noqa: BLE001 - the server is still away: try again
                pass
        if not left or time.monotonic() + pause > deadline:
            break
        time.sleep(pause)
        pause = min(pause * 2, 5.0)
    return left


def close_orphaned_runs(client: MlflowClient, closer_run_id: str) -> list[str]:
    """Mark FAILED the gate runs of any experiment of the store left RUNNING by a gate process that
    is gone (same host, process no longer alive; or RUNNING for over ``ORPHAN_AFTER_S``), so the next
    gate of any model ends a killed gate's run. Returns their ids.

    Example::

        close_orphaned_runs(client, closer_run_id=run_id)
        # ['3f2a...']
    """
    closed = []
    host = socket.gethostname()
    experiments = [e.experiment_id for e in client.search_experiments(max_results=1000)]
    query = f"attributes.status = 'RUNNING' and tags.`{TAG_PID}` LIKE '%'"
    runs = client.search_runs(experiments, filter_string=query, max_results=200) if experiments else []
    for run in runs:
        if run.info.run_id == closer_run_id:
            continue
        tags = run.data.tags
        pid = tags.get(TAG_PID, "")
        if not (pid.isascii() and pid.isdigit()):
            continue  # not a gate's run
        same_host_dead = tags.get(TAG_HOST) == host and not process_alive(int(pid))
        too_old = time.time() - run.info.start_time / 1000 > ORPHAN_AFTER_S
        if same_host_dead or too_old:
            why = (
                f"orphaned: its gate process (host {tags.get(TAG_HOST)}, pid {pid}) ended without "
                f"closing it (e.g. the tracking server was unreachable); closed by gate run {closer_run_id}"
            )
            closed += [run.info.run_id] if not close_runs(client, [run.info.run_id], "FAILED", why, 0) else []
    return closed


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` of this host is alive (a process of another user counts as alive).

    >>> process_alive(os.getpid())
    True
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
