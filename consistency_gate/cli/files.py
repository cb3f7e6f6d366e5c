"""The commands on prediction files, no registry needed: ``compare``, ``generations`` and ``diagnose``."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import click

from consistency_gate.cli.common import echo_json, engine_options, level_option, named_files, reader_threads


@click.command()
@click.option("--labels", "labels", required=True, type=click.Path(path_type=Path), help="File with the true labels.")
@click.option("--previous", required=True, type=click.Path(path_type=Path), help="Previous generation's predictions.")
@click.option("--candidate", required=True, type=click.Path(path_type=Path), help="Candidate's predictions.")
@click.option("--label-column", default="label", show_default=True, help="Column of the labels file with true labels.")
@click.option("--id-column", default=None, help="Column that aligns rows across the files (default: by position).")
@click.option("--k", "ks", type=int, multiple=True, help="k for top-k metrics; repeat for several (default 1 and 5).")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@level_option("--confidence", 0.95, "Level of the intervals in the JSON (Wilson for proportions).")
@click.option(
    "--slice",
    "slices",
    multiple=True,
    help="Also compute every metric per value of this column of the labels file (true_class: per true "
    "class); repeat for several.",
)
@engine_options("spark: compute on Apache Spark (needs pyspark and --id-column).")
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
    reader_threads()
    from consistency_gate.report.compare import comparison_table

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
        echo_json(result)
    else:
        click.echo(comparison_table(result))


@click.command()
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
    """Many generations' report: mean ACC, mean pairwise CON and ACC-CON, flips (as in Wang et al. 2023)."""
    reader_threads()
    from consistency_gate.engines.local import compare_generations
    from consistency_gate.report.text import table

    report = compare_generations(
        labels, named_files(generations, "--generation"), label_column=label_column, id_column=id_column
    )
    if fmt == "json":
        echo_json(report)
        return
    click.echo(
        f"n = {report['n']}; ACC mean {report['acc_mean']:.4f}, CON mean {report['con_mean']:.4f}, "
        f"ACC-CON mean {report['acc_con_mean']:.4f}\n"
    )
    rows = [[g, a, report["unknown_labels"][g]] for g, a in report["acc"].items()]
    click.echo(table(rows, ["generation", "acc", "unknown labels"]) + "\n")
    rows = [[pair, *flips.values()] for pair, flips in report["consecutive_flips"].items()]
    click.echo(table(rows, ["pair", "ctoc", "ctoi", "itoc", "itoi"]))


@click.command()
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
@click.option("--select", "select", is_flag=True, help="Also run HDP's team selection (pool of 3 or more).")
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
            named_files(members, "--member"),
            data=data,
            tracking_uri=tracking_uri,
            label_column=label_column,
            id_column=id_column,
            select=select,
            max_team_size=max_team_size,
            html=fmt == "html",
            train_labels=train_labels,
            train_members=named_files(train_members, "--train-member"),
            train_data=train_data,
        )
    for warning in report["collusion"]["warnings"]:
        click.echo(warning, err=True)
    if fmt == "json":
        echo_json(report)
    elif fmt == "html":
        click.echo(html_page)
    else:
        from consistency_gate.report.diagnose import diagnose_text

        click.echo(diagnose_text(report))
