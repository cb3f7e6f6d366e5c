"""The ``consistency-gate`` command: parses arguments, calls the core, prints results.

Exit codes: 0 passed or nothing to decide, 1 gate failed, 2 usage error, 3 invalid input
data, 4 model or registry error, 5 tracking server or storage unreachable, refused or
unauthorized, 6 internal error (a bug; never a promotion).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click

from consistency_gate.errors import INTERNAL_ERROR, GateError, UsageError, one_line, redact_credentials, redact_logs

if TYPE_CHECKING:
    from consistency_gate.gate.result import GateResult

_verbose = False


def _echo_json(payload: object) -> None:
    """Strict JSON on stdout: undefined numbers are null (their reasons are in the payload), never NaN."""
    from consistency_gate.report.tables import finite_or_null

    click.echo(json.dumps(finite_or_null(payload), indent=2, default=str, allow_nan=False))


def _engine_options(spark_help: str) -> Callable[[click.Command], click.Command]:
    """``--engine local|spark`` and ``--partitions``, for the commands that can run on Spark."""

    def decorate(command: click.Command) -> click.Command:
        command = click.option(
            "--partitions", type=int, default=None, help="With --engine spark: number of partitions."
        )(command)
        return click.option(
            "--engine", type=click.Choice(["local", "spark"]), default="local", show_default=True, help=spark_help
        )(command)

    return decorate


def _set_verbose(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    """``--verbose`` before or after the command name: print an error's traceback too."""
    global _verbose
    _verbose = _verbose or value


def _verbose_option() -> click.Option:
    return click.Option(
        ["--verbose"],
        is_flag=True,
        expose_value=False,
        callback=_set_verbose,
        help="Print the traceback of an error too.",
    )


def _level_option(flag: str, default: float, help_text: str) -> Callable[[click.Command], click.Command]:
    """An option for a level strictly between 0 and 1 (a confidence, a power), its default shown."""
    return click.option(
        flag, type=click.FloatRange(0, 1, min_open=True, max_open=True), default=default, show_default=True,
        help=help_text,
    )  # fmt: skip


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="consistency-gate")
def cli() -> None:
    """Gate retrained classifiers on their consistency with the previous generation."""


@cli.command()
@click.option("--labels", "labels", required=True, type=click.Path(path_type=Path), help="File with the true labels.")
@click.option("--previous", required=True, type=click.Path(path_type=Path), help="Previous generation's predictions.")
@click.option("--candidate", required=True, type=click.Path(path_type=Path), help="Candidate's predictions.")
@click.option("--label-column", default="label", show_default=True, help="Column of the labels file with true labels.")
@click.option("--id-column", default=None, help="Column that aligns rows across the files (default: by position).")
@click.option("--k", "ks", type=int, multiple=True, help="k for top-k metrics; repeat for several (default 1 and 5).")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@_level_option("--confidence", 0.95, "Level of the intervals in the JSON (Wilson for proportions).")
@click.option(
    "--slice",
    "slices",
    multiple=True,
    help="Also compute every metric per value of this column of the labels file (true_class: per true "
    "class); repeat for several.",
)
@_engine_options("spark: compute on Apache Spark (needs pyspark and --id-column).")
def compare(
    labels: Path,
    previous: Path,
    candidate: Path,
    label_column: str,
    id_column: str | None,
    ks: tuple[int, ...],
    fmt: str,
    confidence: float,
    slices: tuple[str, ...],
    engine: str,
    partitions: int | None,
) -> None:
    """Consistency metrics between two prediction files (CSV or Parquet)."""
    _reader_threads()
    from consistency_gate.report.tables import comparison_table

    if engine == "spark":
        from consistency_gate.engines.spark import compare_spark as run
    else:
        from consistency_gate.engines.local import compare_files as run
    options = {"partitions": partitions} if engine == "spark" else {}
    result = run(
        labels,
        previous,
        candidate,
        label_column=label_column,
        id_column=id_column,
        ks=list(ks) or None,
        confidence=confidence,
        slices=slices,
        **options,
    ).to_dict()
    if fmt == "json":
        _echo_json(result)
    else:
        click.echo(comparison_table(result))


@cli.command()
@click.option("--labels", "labels", required=True, type=click.Path(path_type=Path), help="File with the true labels.")
@click.option(
    "--generation",
    "generations",
    required=True,
    multiple=True,
    metavar="NAME=FILE",
    help="A generation's predictions, oldest first; repeat for each (at least two).",
)
@click.option("--label-column", default="label", show_default=True)
@click.option("--id-column", default=None)
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def generations(labels: Path, generations: tuple[str, ...], label_column: str, id_column: str | None, fmt: str) -> None:
    """Paper 003's multi-generation report: mean ACC, mean pairwise CON and ACC-CON, flips."""
    _reader_threads()
    from consistency_gate.engines.local import compare_generations
    from consistency_gate.report.tables import table

    report = compare_generations(
        labels, _named_files(generations, "--generation"), label_column=label_column, id_column=id_column
    )
    if fmt == "json":
        _echo_json(report)
        return
    click.echo(
        f"n = {report['n']}; ACC mean {report['acc_mean']:.4f}, CON mean {report['con_mean']:.4f}, "
        f"ACC-CON mean {report['acc_con_mean']:.4f}\n"
    )
    rows = [[g, a, report["unknown_labels"][g]] for g, a in report["acc"].items()]
    click.echo(table(rows, ["generation", "acc", "unknown labels"]) + "\n")
    rows = [[pair, *flips.values()] for pair, flips in report["consecutive_flips"].items()]
    click.echo(table(rows, ["pair", "ctoc", "ctoi", "itoc", "itoi"]))


@cli.command()
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
@click.option(
    "--tracking-uri",
    default=None,
    help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db).",
)
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
@_engine_options("spark: predict and count on Apache Spark with mlflow.pyfunc.spark_udf (needs pyspark).")
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
    from consistency_gate.report.tables import verdict_markdown, verdict_table

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
        _write_output(unwritten, "standard output", lambda: _echo_json(report))
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


@cli.command()
@click.option("--model", "name", required=True, help="Registered model name whose gates to read.")
@click.option(
    "--tracking-uri",
    default=None,
    help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db).",
)
@click.option(
    "--last",
    type=click.IntRange(1),
    default=5,
    show_default=True,
    help="Champions the newest candidate is compared with for 'forgotten'.",
)
@_level_option("--confidence", 0.95, "Two-sided level of the intervals.")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "markdown"]), default="table", show_default=True)
@click.option("--plot", "plot_path", type=click.Path(path_type=Path), default=None, help="Write the curve as PNG.")
def history(
    name: str, tracking_uri: str | None, last: int, confidence: float, fmt: str, plot_path: Path | None
) -> None:
    """Negative flips over a model's champions, in the order they were promoted, from its gates' ledgers."""
    from consistency_gate.gate.history import model_history
    from consistency_gate.io.output import check_writable
    from consistency_gate.mlops.store import connect
    from consistency_gate.report.tables import history_markdown, history_table

    if plot_path is not None:
        check_writable(plot_path, "--plot")
    _, client = connect(tracking_uri)
    report = model_history(client, name, last, confidence)
    if plot_path is not None:
        from consistency_gate.report.plots import history_curve, png_bytes

        plot_path.write_bytes(png_bytes(history_curve(report)))
    if fmt == "json":
        _echo_json(report)
    else:
        click.echo(history_markdown(report) if fmt == "markdown" else history_table(report), nl=fmt != "markdown")


@cli.command("report-schema")
@click.option("--history", "of_history", is_flag=True, help="The schema of `history --format json` instead.")
def report_schema(of_history: bool) -> None:
    """Print the JSON Schema of the --report / --format json report (its schema_version is in every report)."""
    from consistency_gate.report.schema import report_schema as schema

    click.echo(json.dumps(schema("history" if of_history else "report"), indent=2))


@cli.command()
@click.option("--default", "show_default", is_flag=True, help="Print the packaged default config.")
@click.option(
    "--check",
    "check_path",
    type=click.Path(path_type=Path),
    default=None,
    help="Validate a config (rules and remediation) without touching a model or a server.",
)
def config(show_default: bool, check_path: Path | None) -> None:
    """Print the default gate configuration (YAML), or check one."""
    from consistency_gate.gate.rules import default_config_text, load_config

    if show_default == (check_path is not None):
        raise click.UsageError("give exactly one of --default and --check FILE")
    if show_default:
        click.echo(default_config_text(), nl=False)
        return
    cfg = load_config(check_path)
    click.echo(f"{check_path}: valid; {len(cfg.rules)} rules, ks {list(cfg.ks)}")
    for rule in cfg.rules:
        click.echo(f"  {rule.describe()}")
    if cfg.remediation is not None:
        remediation = cfg.remediation
        settings = remediation.settings
        data = (
            f"recipe {remediation.recipe}, training data {remediation.data}"
            if remediation.can_train
            else "no training data: the methods that train are skipped"
        )
        click.echo(
            f"  remediation: {' then '.join(remediation.methods)} "
            f"(m={settings.m}, N={settings.n_snapshots}, epochs={settings.epochs}), {data}"
        )


@cli.command()
@click.option(
    "--config",
    "--rules",
    "rules_path",
    required=True,
    type=click.Path(path_type=Path),
    help="The gate config (YAML) whose rules to plan for (--rules: its old name).",
)
@click.option(
    "--rate",
    "rates",
    multiple=True,
    metavar="METRIC=R",
    help="The rate you expect for a metric (e.g. ctoi=0.01); repeat for several.",
)
@click.option(
    "--confidence",
    type=click.FloatRange(0.5, 1, min_open=True, max_open=True),
    default=None,
    help="One-sided level of the rules' bounds (default: the config's, else 0.95).",
)
@_level_option("--power", 0.8, "The chance that the rule gives the right answer for a model at the expected rate.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def plan(rules_path: Path, rates: tuple[str, ...], confidence: float | None, power: float, fmt: str) -> None:
    """How many evaluation samples each rule needs to pass a model at the rate you expect (before building a set)."""
    from consistency_gate.gate.rules import load_config, plan_sizes
    from consistency_gate.report.tables import fmt_share, table

    cfg = load_config(rules_path)
    if not rates:
        metrics = sorted({r.metric for r in cfg.rules})
        raise UsageError(
            f"plan needs the rate you expect for a rule's metric: --rate METRIC=R, e.g. --rate ctoi=0.01 "
            f"(the rules of {rules_path} are on {', '.join(metrics)})"
        )
    expected: dict[str, float] = {}
    for item in rates:
        metric, sep, value = item.partition("=")
        try:
            expected[metric.strip()] = float(value)
        except ValueError:
            raise click.UsageError(f"--rate {item}: expected METRIC=R with R a number, e.g. ctoi=0.01") from None
        if not sep or not 0.0 <= expected[metric.strip()] <= 1.0:
            raise click.UsageError(f"--rate {item}: expected METRIC=R with R in [0, 1]")
    level = confidence or cfg.confidence
    rows = plan_sizes(cfg.rules, expected, level, power)
    if fmt == "json":
        _echo_json({"confidence": level, "power": power, "rules": rows})
        return
    click.echo(
        f"Samples at which each rule passes a model at the rate you expect with {power:.0%} power "
        f"(bounds one-sided at {level:.0%}, exact binomial):"
    )
    cells = [
        [r["rule"], r["decide"], r["rate"], r["samples"], fmt_share(r["power"]), fmt_share(r["false_pass"]), r["note"]]
        for r in rows
    ]
    click.echo(table(cells, ["rule", "decide", "rate", "samples", "power", "false pass", "note"]))


@cli.command()
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
    from consistency_gate.report.tables import verdict_table

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


@cli.command()
@click.option(
    "--labels",
    "labels",
    type=click.Path(path_type=Path),
    default=None,
    help="File with the true labels (not needed when every member is a registry model and --data is given).",
)
@click.option(
    "--member",
    "members",
    required=True,
    multiple=True,
    metavar="NAME=FILE|models:/NAME/VERSION",
    help="A member's predictions file, or a registered model version to predict --data with.",
)
@click.option("--data", type=click.Path(path_type=Path), default=None, help="Features and labels for registry members.")
@click.option("--tracking-uri", default=None, help="MLflow tracking URI for registry members.")
@click.option("--label-column", default="label", show_default=True)
@click.option("--id-column", default=None)
@click.option("--select", "select", is_flag=True, help="Also run paper 004's team selection (pool of 3 or more).")
@click.option("--max-team-size", type=int, default=None, help="Largest team size for --select (default: the pool).")
@click.option(
    "--train-member",
    "train_members",
    multiple=True,
    metavar="NAME=FILE",
    help="A member's predictions on its training set (same names as --member), for the collusion check.",
)
@click.option("--train-labels", type=click.Path(path_type=Path), default=None, help="The training set's labels.")
@click.option(
    "--train-data", type=click.Path(path_type=Path), default=None, help="Training features and labels (registry)."
)
@click.option("--format", "fmt", type=click.Choice(["table", "json", "html"]), default="table", show_default=True)
def diagnose(
    labels: Path | None,
    members: tuple[str, ...],
    data: Path | None,
    tracking_uri: str | None,
    label_column: str,
    id_column: str | None,
    select: bool,
    max_team_size: int | None,
    train_members: tuple[str, ...],
    train_labels: Path | None,
    train_data: Path | None,
    fmt: str,
) -> None:
    """Why an ensemble of these members helps or not: accuracy, overlap, diversity, decomposition."""
    from consistency_gate.diagnostics.diagnose import run_diagnose

    with contextlib.redirect_stdout(sys.stderr):  # keep stdout for the report
        report, html_page = run_diagnose(
            labels,
            _named_files(members, "--member"),
            data=data,
            tracking_uri=tracking_uri,
            label_column=label_column,
            id_column=id_column,
            select=select,
            max_team_size=max_team_size,
            html=fmt == "html",
            train_labels=train_labels,
            train_members=_named_files(train_members, "--train-member"),
            train_data=train_data,
        )
    for warning in report["collusion"]["warnings"]:
        click.echo(warning, err=True)
    if fmt == "json":
        _echo_json(report)
    elif fmt == "html":
        click.echo(html_page)
    else:
        from consistency_gate.report.tables import diagnose_text

        click.echo(diagnose_text(report))


READER_ENVIRONMENT = {"OPENBLAS_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
"""Where ``compare`` and ``generations`` start numpy: they do no linear algebra, and numba's kernels
share the cores with pyarrow's parser threads, so OpenBLAS's threads (numpy's, and scipy's, which
numba loads) and numba's idle OpenMP workers would only spin: 7-9% of a compare's CPU time on 400k
rows, 2% of its wall time, on 2 cores."""


def _reader_threads() -> None:
    """Set :data:`READER_ENVIRONMENT` where the environment does not, in a process that has not
    loaded numpy yet (a command's own, not a caller's that goes on to train a model)."""
    if "numpy" not in sys.modules:
        for name, value in READER_ENVIRONMENT.items():
            os.environ.setdefault(name, value)


def _named_files(items: tuple[str, ...], option: str) -> dict[str, str]:
    named: dict[str, str] = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise click.BadParameter(f"{item!r}: expected NAME=FILE", param_hint=option)
        if name in named:
            raise click.BadParameter(f"name {name!r} is given twice", param_hint=option)
        named[name] = path
    return named


for _command in (cli, *cli.commands.values()):  # `consistency-gate --verbose check` and `check ... --verbose`
    _command.params.append(_verbose_option())


# third-party noise the tool's own output replaces: MLflow's INFO lines, artifact progress bars, and its
# "View run ... at: URL" lines (the tool prints the run's link itself, credentials redacted; MLflow's
# print the tracking URI as given, password and all)
QUIET_ENVIRONMENT = {
    "MLFLOW_LOGGING_LEVEL": "WARNING",
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",
}


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the CLI and turn GateErrors into one line and their exit code. MLflow's
    INFO lines, progress bars and run links are off unless the environment sets them
    (``QUIET_ENVIRONMENT``); credentials are redacted in every log line."""
    global _verbose
    _verbose = False  # set by this call's --verbose only (main may run more than once in a process)
    for name, value in QUIET_ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    redact_logs()
    try:
        code = cli.main(args=argv, standalone_mode=False)
    except GateError as exc:
        _print_traceback()
        click.echo(f"error: {one_line(redact_credentials(str(exc)))}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except Exception as exc:  # noqa: BLE001 - anything else is a bug: say so, with exit 6
        _print_traceback()
        first = one_line(redact_credentials(str(exc)))
        click.echo(
            f"internal error: {type(exc).__name__}: {first[:300]} (a bug in consistency-gate; nothing was promoted; "
            "please report it with the output of `consistency-gate --verbose ...`)",
            err=True,
        )
        sys.exit(INTERNAL_ERROR)
    sys.exit(code if isinstance(code, int) else 0)


def _print_traceback() -> None:
    """With ``--verbose``, the error's traceback on stderr, credentials redacted (a tracking URI's
    password is in MLflow's messages: ``API request to http://user:secret@host ...``)."""
    if _verbose:
        click.echo(redact_credentials(traceback.format_exc()), err=True, nl=False)


def run() -> None:
    """The console script and ``python -m consistency_gate``: :func:`main`, then an exit without the
    interpreter's last full garbage collection (``gc.freeze``), which would walk every object pandas,
    pyarrow and numba made (about 0.1 s of a ``compare``, 5%) for memory the exit gives back anyway.
    Exit handlers (MLflow's among them) still run; :func:`main` alone is for callers that go on."""
    try:
        main()
    finally:
        gc.freeze()


if __name__ == "__main__":
    run()
