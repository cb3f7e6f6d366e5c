"""The commands on a registered model: ``check`` (the gate, or the same gate on prediction files),
``history`` (the champions' updates) and ``demo``."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click

from consistency_gate.cli.common import echo_json, engine_options, level_option, tracking_uri_option
from consistency_gate.errors import UsageError

if TYPE_CHECKING:
    from consistency_gate.gate.result import GateResult


@click.command()
@click.option("--model", default=None, help="Registered model name (or gate prediction files: --labels ...).")
@click.option("--candidate", default=None, help="Candidate version: a number or @alias (default: the latest version).")
@click.option("--baseline", default=None, help="Previous generation: @alias or version (default @champion).")
@click.option("--data", default=None, type=click.Path(path_type=Path), help="Evaluation data (CSV or Parquet).")
@click.option(
    "--labels",
    default=None,
    type=click.Path(path_type=Path),
    help="Without a registry: the true labels of the predictions below.",
)
@click.option(
    "--previous-predictions",
    default=None,
    type=click.Path(path_type=Path),
    help="Without a registry: the previous generation's prediction file.",
)
@click.option(
    "--candidate-predictions",
    default=None,
    type=click.Path(path_type=Path),
    help="Without a registry: the candidate's prediction file.",
)
@click.option(
    "--name",
    default=None,
    help="Without a registry: the name the run is logged under (experiment consistency-gate/NAME; default "
    "predictions).",
)
@click.option("--label-column", default="label", show_default=True)
@click.option("--id-column", default=None, help="Column identifying samples (kept in the flip table).")
@click.option(
    "--config",
    "config_path",
    default=None,
    type=click.Path(path_type=Path),
    help="Gate rules (YAML); default: the packaged rules (`consistency-gate config --default`).",
)
@tracking_uri_option
@click.option(
    "--report",
    "report_path",
    default=None,
    type=click.Path(path_type=Path),
    help="Write the verdict as JSON to this file.",
)
@click.option("--promote", is_flag=True, help="On pass only, move the baseline alias to the candidate.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "json", "markdown", "html"]),
    default="table",
    show_default=True,
    help="html: the report page (also logged as gate/report.html), e.g. > report.html",
)
@click.option(
    "--summary",
    "summary_path",
    default=None,
    type=click.Path(path_type=Path),
    help="Append the verdict as Markdown to this file (e.g. $GITHUB_STEP_SUMMARY).",
)
@click.option("--quiet", is_flag=True, help="No progress bars (they are off anyway when stderr is not a terminal).")
@click.option(
    "--cost",
    is_flag=True,
    help="Measure the candidate's serving cost (timed predictions, size on disk) even when no rule or repair needs it.",
)
@click.option(
    "--floor",
    default=None,
    help="A seed replica of the baseline (a version or @alias of the model): report the churn no retrain avoids "
    "and ctoi_excess (default: the config's floor:).",
)
@engine_options("spark: predict and count on Apache Spark with mlflow.pyfunc.spark_udf (needs pyspark).")
def check(
    model: str,
    candidate: str | None,
    baseline: str | None,
    data: Path | None,
    labels: Path | None,
    previous_predictions: Path | None,
    candidate_predictions: Path | None,
    name: str | None,
    label_column: str,
    id_column: str | None,
    config_path: Path | None,
    tracking_uri: str | None,
    report_path: Path | None,
    promote: bool,
    fmt: str,
    summary_path: Path | None,
    quiet: bool,
    cost: bool,
    floor: str | None,
    engine: str,
    partitions: int | None,
) -> int:
    """Gate a candidate model version against the previous generation (exit 0 pass, 1 fail), or,
    with --labels, --previous-predictions and --candidate-predictions, two prediction files."""
    from consistency_gate.io.output import check_writable
    from consistency_gate.report.verdict import verdict_markdown, verdict_table

    if summary_path:  # before any work: a gate never promotes and then fails to write its summary
        check_writable(summary_path, "--summary")
    files = {"--labels": labels, "--previous-predictions": previous_predictions}
    files["--candidate-predictions"] = candidate_predictions
    registry_options = {"--model": model, "--data": data, "--candidate": candidate, "--baseline": baseline}
    with contextlib.redirect_stdout(sys.stderr):  # MLflow prints run links; stdout is the result's
        if any(v is not None for v in files.values()):
            from consistency_gate.gate.files import DEFAULT_NAME, run_file_gate

            refused = {**registry_options, "--promote": promote or None, "--cost": cost or None, "--floor": floor}
            _require_only(files, refused, engine)
            result = run_file_gate(
                labels,
                previous_predictions,
                candidate_predictions,
                name=name or DEFAULT_NAME,
                label_column=label_column,
                id_column=id_column,
                config=config_path,
                tracking_uri=tracking_uri,
                report_path=report_path,
                html=fmt == "html",
            )
        else:
            from consistency_gate.gate.run import run_gate

            _require_only({"--model": model, "--data": data}, {"--name": name}, engine="local")
            result = run_gate(
                model,
                data,
                candidate=candidate,
                baseline=baseline,
                label_column=label_column,
                id_column=id_column,
                config=config_path,
                tracking_uri=tracking_uri,
                report_path=report_path,
                promote=promote,
                quiet=quiet,
                engine=engine,
                partitions=partitions,
                cost=cost,
                floor=floor,
            )
    report = result.to_dict()
    unwritten = list(result.unwritten)  # --report, when the session could not write it
    if summary_path:
        _write_output(unwritten, f"--summary {summary_path}", lambda: _append(summary_path, verdict_markdown(report)))
    if fmt == "json":
        _write_output(unwritten, "standard output", lambda: echo_json(report))
    elif fmt == "markdown":
        _write_output(unwritten, "standard output", lambda: click.echo(verdict_markdown(report)))
    elif fmt == "html" and result.html:
        _write_output(unwritten, "standard output", lambda: click.echo(result.html))
    else:  # html with nothing decided has no page: the table says why
        _write_output(unwritten, "standard output", lambda: click.echo(verdict_table(report)))
    if result.promotion and result.promoted is not True:
        click.echo(f"error: {result.promotion['reason']}", err=True)
    if unwritten:  # the gate decided and did what it says; only an output is missing: storage, exit 5
        click.echo(f"warning: could not write {'; '.join(unwritten)}; {_what_happened(result)}", err=True)
        return max(result.exit_code, 5)
    return result.exit_code


def _append(path: Path, text: str) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(text)


def _write_output(unwritten: list[str], what: str, write: Callable[[], None]) -> None:
    """Write one of the gate's outputs, standard output flushed; a failure (a full disk, a closed pipe,
    a read-only path) is added to ``unwritten`` instead of raised: the gate has decided by now, and
    may have promoted."""
    try:
        write()
        if what == "standard output":
            sys.stdout.flush()
    except OSError as exc:
        unwritten.append(f"{what} ({type(exc).__name__}: {exc.strerror or exc})")
        if what == "standard output":  # nothing more can reach a closed or full stdout
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - for the interpreter's last flush


def _what_happened(result: GateResult) -> str:
    """The verdict and the promotion in words, for the warning about an output that was not written."""
    said = f"the gate's verdict is {result.verdict.upper()}"
    if result.promotion is None:
        return f"{said}; nothing was promoted (run {result.run_id})"
    promotion = result.promotion
    holds = "unknown" if promotion["holds"] in (None, "unknown") else f"v{promotion['holds']}"
    moved = {True: "promoted", False: "not promoted"}.get(result.promoted, "promotion unknown")
    return f"{said}; v{promotion['version']} {moved}: @{promotion['alias']} holds {holds} (run {result.run_id})"


def _require_only(needed: dict[str, object], refused: dict[str, object], engine: str) -> None:
    """UsageError unless every ``needed`` option is given and no ``refused`` one is: `check` gates
    either registered models (--model, --data) or prediction files (--labels, ...)."""
    missing = [flag for flag, value in needed.items() if value is None]
    if missing:
        raise UsageError(
            f"check needs {', '.join(needed)}; missing {', '.join(missing)} (gate registered models with --model "
            "and --data, or prediction files with --labels, --previous-predictions and --candidate-predictions)"
        )
    extra = [flag for flag, value in refused.items() if value is not None]
    if extra or engine != "local":
        extra = extra or ["--engine spark"]
        why = (
            "--name names the run of a prediction-file gate; a registry gate's run is named after its model"
            if "--model" in needed
            else "prediction files gate without a registry (no versions to load, nothing to promote or time)"
        )
        raise UsageError(f"{', '.join(extra)} cannot be combined with {', '.join(needed)}: {why}")


@click.command()
@click.option("--model", "name", required=True, help="Registered model name whose gates to read.")
@tracking_uri_option
@click.option(
    "--last",
    type=click.IntRange(1),
    default=5,
    show_default=True,
    help="Champions the newest candidate is compared with for 'forgotten'.",
)
@level_option("--confidence", 0.95, "Two-sided level of the intervals.")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "markdown"]), default="table", show_default=True)
@click.option("--plot", "plot_path", type=click.Path(path_type=Path), default=None, help="Write the curve as PNG.")
def history(
    name: str, tracking_uri: str | None, last: int, confidence: float, fmt: str, plot_path: Path | None
) -> None:
    """Negative flips over a model's champions, in the order they were promoted, from its gates' ledgers."""
    from consistency_gate.gate.history import model_history
    from consistency_gate.io.output import check_writable
    from consistency_gate.mlops.store import connect
    from consistency_gate.report.history import history_markdown, history_table

    if plot_path is not None:
        check_writable(plot_path, "--plot")
    _, client = connect(tracking_uri, existing=True)
    report = model_history(client, name, last, confidence)
    if plot_path is not None and not report["steps"]:
        click.echo(f"no update to draw: {plot_path} not written", err=True)
    elif plot_path is not None:
        from consistency_gate.report.plots import history_curve, png_bytes

        plot_path.write_bytes(png_bytes(history_curve(report)))
        click.echo(f"wrote the history plot to {plot_path}", err=True)
    if fmt == "json":
        echo_json(report)
    else:
        click.echo(history_markdown(report) if fmt == "markdown" else history_table(report), nl=fmt != "markdown")


@click.command()
@click.option(
    "--workdir",
    default="consistency-gate-demo",
    show_default=True,
    type=click.Path(path_type=Path),
    help="Folder for the SQLite store, artifacts, data and report (recreated on each run).",
)
def demo(workdir: Path) -> None:
    """Train two generations on a bundled data set, register them locally, and run the gate."""
    from mlflow import MlflowClient

    from consistency_gate.demo import MODEL_NAME, prepare
    from consistency_gate.gate.run import run_gate
    from consistency_gate.mlops.tracking import run_page
    from consistency_gate.report.verdict import verdict_table

    click.echo(f"Training two generations of '{MODEL_NAME}' and registering them in {workdir}/mlflow.db ...")
    uri, eval_path, config_path = prepare(workdir)
    click.echo(f"Generation 1 holds @champion; gating generation 2 against it with {config_path}.\n")
    result = run_gate(
        MODEL_NAME,
        eval_path,
        candidate="2",
        id_column="id",
        tracking_uri=uri,
        config=config_path,
        report_path=workdir / "report.json",
    )
    click.echo(verdict_table(result.to_dict()))
    click.echo(f"\nIn CI this gate would exit {result.exit_code}. The JSON report is {workdir / 'report.json'}.")
    experiment = MlflowClient(tracking_uri=uri).get_run(result.run_id).info.experiment_id
    click.echo(
        f"See the run (rules, flip table, plots) in the MLflow UI:\n  mlflow ui --backend-store-uri {uri}\n"
        f"then open {run_page('http://127.0.0.1:5000', experiment, result.run_id)}"
    )
