"""One gate's session: its MLflow run from start to end, and its ``--report`` on every exit.

Both gates run inside one: the gate of registered models (:mod:`consistency_gate.gate.run`) and
the gate of prediction files (:mod:`consistency_gate.gate.files`). The session owns what they
share, so that they behave the same:

- connecting to the tracking store (an unreachable server is exit 5 before any work);
- the gate run: started in the experiment ``consistency-gate/<name>`` (nested under a
  pipeline's own run), tagged with its owner so that a later gate can close it if this process
  dies, renamed with its verdict and versions first once there is one (``FAILED v2 vs v1: ctoi
  (digits)``), and ended FINISHED;
- the verdict's artifacts: ``gate/report.json`` (once), ``gate/report.html``, the run's tags
  and its Markdown description;
- on any error: every run it started ended FAILED (retrying while the server comes back),
  MLflow's and the network's errors turned into exit codes, and an error report written to
  ``--report`` for every exit code >= 2, before the run starts too.

    with GateSession(report_path) as session:
        uri, client = session.connect(tracking_uri)
        session.start("consistency-gate/digits", "gate digits v2")
        ...  # decide, log the decision
        session.log_verdict(result, decision)
        return session.finish(result)
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from consistency_gate.errors import INTERNAL_ERROR, GateError, TrackingError, redact_credentials
from consistency_gate.gate.decision import tag_run
from consistency_gate.io.output import check_writable
from consistency_gate.mlops import store, tracking
from consistency_gate.report.schema import SCHEMA_VERSION
from consistency_gate.report.text import markdown_safe
from consistency_gate.report.verdict import verdict_markdown

if TYPE_CHECKING:
    from mlflow import MlflowClient

    from consistency_gate.gate.decision import Decision
    from consistency_gate.gate.result import GateResult
    from consistency_gate.gate.rules import RuleResult

# how long a failing gate keeps trying to mark its runs FAILED on a tracking server that went away
END_RUN_RETRY_S = float(os.environ.get("CONSISTENCY_GATE_END_RUN_RETRY_S", "30"))


def run_title(result: GateResult, started_as: str) -> str:
    """A gate run's name in the runs list: the outcome and the versions first (the MLflow UI cuts a name
    at its column's width, about 17 characters at 1400 px: ``REPAIRED v2 vs v1`` fits), then the metrics
    of the rules that failed and the model; a gate of prediction files keeps the name it started with,
    less its ``gate``. A repair registered in the candidate's place is REPAIRED (the report's outcome
    ``remediated``).

    >>> from consistency_gate.gate.result import GateResult
    >>> from consistency_gate.gate.rules import Rule, RuleResult
    >>> failed = [RuleResult(Rule("ctoi", "max", 0.02), 0.05, False), RuleResult(Rule("con", "min", 0.9), 0.95, True)]
    >>> result = GateResult("failed", failed, {}, None, {"name": "clf", "version": "2"}, {"version": "1"})
    >>> run_title(result, "gate clf v2")
    'FAILED v2 vs v1: ctoi (clf)'
    """
    word = "REPAIRED" if result.outcome == "remediated" else result.outcome.upper()
    failed = ", ".join(dict.fromkeys(r.rule.metric for r in result.rules if r.blocks))
    cand, base = result.candidate, result.baseline or {}
    if cand.get("version"):
        against = f" vs v{base['version']}" if base.get("version") else ""
        return f"{word} v{cand['version']}{against}{': ' + failed if failed else ''} ({cand['name']})"
    return f"{word}{' ' + failed if failed else ''}: {started_as.removeprefix('gate ')}"


def version_description(
    verdict: str,
    rules: list[RuleResult],
    versions: tuple[str, dict | None],
    data: str,
    n: int,
    replaces: str = "",
    noun: str = "repair",
) -> str:
    """What the gate found, as the first paragraph of a version's description in the registry (the
    versions table shows its first characters, the version page all of it above the tags): the verdict
    and the versions first, as the run names say them, then on which data, the failed rules with their
    measured values, and for a repair (``noun``: what it is, as its method describes it) the version it
    stands in for. ``versions``: the version described and its baseline. One paragraph, Markdown-escaped;
    :func:`~consistency_gate.mlops.registry.describe_version` signs it with the run.

    >>> from consistency_gate.gate.rules import Rule, RuleResult
    >>> failed = [RuleResult(Rule("ctoi", "max", 0.02), 0.0517, False), RuleResult(Rule("con", "min", 0.9), 0.95, True)]
    >>> print(version_description("failed", failed, ("2", {"version": "1", "alias": "champion"}), "eval.csv", 500))
    FAILED v2 vs v1 (@champion) on eval.csv (500 samples): ctoi <= 0.02 failed (0.0517).
    >>> version_description("passed", failed[1:], ("3", {"version": "1"}), "eval.csv", 500, "2", "rerank repair")[:50]
    'PASSED v3 (rerank repair of v2) vs v1 on eval.csv '
    """
    version, baseline = versions
    repair = f" ({noun} of v{replaces})" if replaces else ""
    against = " as the first generation (no baseline)"
    if baseline and baseline.get("version"):
        against = f" vs v{baseline['version']}" + (f" (@{baseline['alias']})" if baseline.get("alias") else "")
    failed = [f"{r.rule.describe()} failed{_measured(r)}" for r in rules if r.blocks]
    waived = [r for r in rules if r.waived]
    held = sum(r.held is True for r in rules)
    found = ", ".join(failed) if failed else f"{held} rule{'s' if held != 1 else ''} held"
    if waived:  # the rules a clearly better candidate failed, and why they did not block it
        found += "; " + ", ".join(f"{r.rule.describe()} waived{_measured(r)}" for r in waived)
        found += f", {waived[0].waived.removeprefix('waived: ')}"
    text = f"{verdict.upper()} v{version}{repair}{against} on {data} ({n} samples): {found}."
    instead = f" Registered in place of v{replaces}, which failed." if replaces else ""
    return f"{markdown_safe(text)}{instead}"


def _measured(result: RuleResult) -> str:
    """What a failed rule measured, as the description says it: the value, and the bound it was judged on
    when that is what it compared (``decide: upper|lower``).

    >>> from consistency_gate.gate.rules import Rule, RuleResult
    >>> _measured(RuleResult(Rule("ctoi", "max", 0.02, decide="upper"), 0.0533, False, compared=0.071))
    ' (0.0533; judged on its upper bound 0.071)'
    """
    if result.value is None:
        return ""
    if result.rule.decide != "estimate" and result.compared is not None and result.compared != result.value:
        return f" ({result.value:.4g}; judged on its {result.rule.decide} bound {result.compared:.4g})"
    return f" ({result.value:.4g})"


class GateSession:
    """A gate's run and report; a context manager that ends the runs and writes the report on error.

    ``report_path`` is where ``--report`` goes (None: nowhere). Inside the ``with`` block an
    exception ends every run the session started as FAILED, writes the error report and leaves
    the block as a :class:`~consistency_gate.errors.GateError` with its exit code (an MLflow or
    network error becomes a :class:`~consistency_gate.errors.TrackingError`, exit 5); anything
    else is a bug and is raised as it is (exit 6), its error report written too.

    >>> import tempfile
    >>> from consistency_gate.errors import DataError
    >>> path = Path(tempfile.mkdtemp()) / "report.json"
    >>> try:
    ...     with GateSession(path):
    ...         raise DataError("labels.csv: column 'label' is missing")
    ... except DataError:
    ...     pass
    >>> report = json.loads(path.read_text())
    >>> report["verdict"], report["exit_code"], report["run_id"]
    ('error', 3, None)
    """

    def __init__(self, report_path: str | Path | None) -> None:
        self.report_path = check_writable(report_path, "--report") if report_path else None
        self.uri = ""
        self.client: MlflowClient | None = None
        self.started: list[str] = []  # the runs this gate opened: the gate run first, then remediation runs
        self.experiment_id = ""
        self.owner = ""  # what the runs it leaves RUNNING belong to, for the error message
        self.run_name = ""  # the name the gate run started with (its verdict leads it once decided)
        self.token = uuid.uuid4().hex  # tags every run it creates (tracking.TAG_SESSION)

    def __enter__(self) -> GateSession:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> bool:
        if exc is None:
            return False
        error = self.fail(exc)
        if error is exc:
            return False
        raise error from exc

    @property
    def run_id(self) -> str | None:
        """The gate run's id (None before it started)."""
        return self.started[0] if self.started else None

    def connect(self, tracking_uri: str | None, existing: bool = False) -> tuple[str, MlflowClient]:
        """Connect to the tracking store (:func:`consistency_gate.mlops.store.connect`) before any work;
        ``existing``: a store that must exist already (a registry gate's)."""
        self.uri, self.client = store.connect(tracking_uri, existing)
        return self.uri, self.client

    def start(self, experiment: str, run_name: str, owner: str) -> str:
        """Start the gate run in ``experiment`` (nested under the caller's active run, if any),
        tag its owner and close runs of the experiment that dead gates left RUNNING; returns its id.
        ``owner`` names what is gated, for messages."""
        import mlflow

        self.owner = owner
        try:
            self.experiment_id = tracking.experiment_id(experiment, self.uri)
            run = mlflow.start_run(
                experiment_id=self.experiment_id,
                run_name=run_name,
                nested=mlflow.active_run() is not None,
                tags={**tracking.pending_tags(), **tracking.owner_tags(self.token), **tracking.started_by_tags()},
            )
        except Exception as exc:  # noqa: BLE001 - MLflow and requests raise many kinds here
            if self.experiment_id:  # a create that reached the server, its response lost: end that run
                tracking.close_lost_runs(self.client, self.experiment_id, self.token, self.started)
            raise store.refusal(exc, self.uri) or TrackingError(
                f"cannot start an MLflow run on {redact_credentials(self.uri)}: {exc}"
            ) from None
        self.started.append(run.info.run_id)
        self.run_name = run_name
        tracking.close_orphaned_runs(self.client, run.info.run_id)
        tracking.close_lost_runs(self.client, self.experiment_id, self.token, self.started)  # a retried create's twin
        return run.info.run_id

    @contextlib.contextmanager
    def child_run(self, run_name: str) -> Iterator[str]:
        """A run nested in the gate run (one remediation attempt), ended FINISHED when the block
        ends and FAILED with the gate if it raises; yields its id."""
        import mlflow

        tags = tracking.owner_tags(self.token)
        with mlflow.start_run(experiment_id=self.experiment_id, run_name=run_name, nested=True, tags=tags) as child:
            self.started.append(child.info.run_id)
            yield child.info.run_id

    def log_verdict(self, result: GateResult, decision: Decision, diagnosis: dict | None = None) -> None:
        """The verdict's artifacts in the gate run (:meth:`log_report`), and its name led by the verdict."""
        self.log_report(result, decision, diagnosis)
        # the verdict and the failed rules first: the MLflow UI's runs list cuts a long name at its width
        self.client.update_run(self.run_id, name=run_title(result, self.run_name))

    def log_report(self, result: GateResult, decision: Decision, diagnosis: dict | None = None) -> None:
        """``gate/report.json``, ``gate/report.html`` (kept in ``result.html``), the run's tags and
        its description, from ``result`` as it stands (logged again after a promotion)."""
        report = result.to_dict()
        result.html = decision.html(report, diagnosis)
        with tracking.uploads():
            tracking.log_json(report, "gate/report.json")
            tracking.log_html(result.html, "gate/report.html")
        tag_run(report)
        tracking.describe_run(verdict_markdown(report))

    def finish(self, result: GateResult) -> GateResult:
        """Write the report and end the gate run FINISHED; returns ``result``. After a promotion a
        run that cannot be ended (retried for ``END_RUN_RETRY_S``) is a warning in the report (the
        next gate marks it FAILED), not an error that would hide what the alias holds."""
        try:
            self.write_report(result.to_dict())
        except OSError as exc:  # the gate has decided (and may have promoted): a missing output, not a failed gate
            result.unwritten.append(f"--report {self.report_path} ({type(exc).__name__}: {exc.strerror or exc})")
        if self.started:  # a gate on prediction files without a tracking store started none: no MLflow import
            import mlflow

            try:
                mlflow.end_run("FINISHED")
            except Exception as exc:  # noqa: BLE001 - MLflow and requests raise many kinds
                if result.promotion is None:
                    raise
                if not tracking.close_runs(self.client, self.started[:1], "FINISHED", None, END_RUN_RETRY_S):
                    return result  # ended on a later try
                result.warnings.append(
                    f"the gate run could not be ended ({type(exc).__name__}: {redact_credentials(str(exc))[:300]}); "
                    f"the next gate of '{self.owner}' marks it FAILED"
                )
                with contextlib.suppress(OSError):  # said in result.unwritten already
                    self.write_report(result.to_dict())
        return result

    def write_report(self, report: dict) -> None:
        """Write ``report`` to ``--report``, if one is asked."""
        if self.report_path is not None:
            self.report_path.write_text(json.dumps(report, indent=2, default=str))

    def fail(self, exc: BaseException) -> BaseException:
        """End the runs FAILED and return the error to raise (an MLflow or network error as a
        :class:`TrackingError`, naming the runs left RUNNING); the error report is written for
        every error but an interrupt."""
        left = end_failed(exc, self.started, self.client) if self.started else []
        error = exc
        if self.uri and not isinstance(exc, GateError):
            refused = store.refusal(exc, self.uri)
            if refused is not None:
                error = refused
            elif store.looks_unreachable(exc):
                error = TrackingError(
                    f"tracking server or storage became unreachable during the gate: {store.store_failure(exc)}"
                )
        if left:
            error = type(error)(
                f"{error}; runs left RUNNING (the server did not answer within {END_RUN_RETRY_S:.0f} s): "
                f"{', '.join(left)}: the next gate of '{self.owner}' marks them FAILED"
            )
        if isinstance(error, Exception):
            self.write_report(error_report(error, self.run_id, left))
        return error


def error_report(error: Exception, run_id: str | None, left_running: list[str] | None = None) -> dict:
    """The ``--report`` of a gate that ended in an error: what went wrong and its exit code.

    >>> from consistency_gate.errors import ModelError
    >>> error_report(ModelError("model 'clf' has no version 7"), None)["exit_code"]
    4
    >>> error_report(KeyError("x"), "abc")["error"]
    "internal error: KeyError: 'x'"
    """
    if isinstance(error, GateError):
        code, message = error.exit_code, str(error)
    else:
        code, message = INTERNAL_ERROR, f"internal error: {type(error).__name__}: {error}"
    return {
        "schema_version": SCHEMA_VERSION,
        "verdict": "error",
        "error": redact_credentials(message),
        "exit_code": code,
        "run_id": run_id,
        "left_running": left_running or [],
    }


def end_failed(exc: BaseException, run_ids: list[str], client: MlflowClient) -> list[str]:
    """End the gate's runs (the gate run and a nested remediation run) as FAILED, retrying while
    the tracking server comes back within ``END_RUN_RETRY_S``; returns the ids left RUNNING.

    Example::

        end_failed(ValueError("bad row"), [run.info.run_id], client)
        # []
    """
    import mlflow

    # leave the fluent stack as the caller had it: pop only the runs this gate started
    for _ in run_ids:
        active = mlflow.active_run()
        if active is None or active.info.run_id not in run_ids:
            break
        with contextlib.suppress(Exception):  # popped even when the store is gone; closed below
            mlflow.end_run("FAILED")
    return tracking.close_runs(
        client, run_ids, "FAILED", f"{type(exc).__name__}: {redact_credentials(str(exc))}", END_RUN_RETRY_S
    )
