"""What the commands share: strict JSON output, the Spark and level options, named files, reader threads."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import click


def echo_json(payload: object) -> None:
    """Strict JSON on stdout: undefined numbers are null (their reasons are in the payload), never NaN."""
    from consistency_gate.report.text import finite_or_null

    click.echo(json.dumps(finite_or_null(payload), indent=2, default=str, allow_nan=False))


tracking_uri_option = click.option(
    "--tracking-uri",
    default=None,
    help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db).",
)


report_option = click.option(
    "--report", "report_path", default=None, type=click.Path(path_type=Path), help="Write the report as JSON here."
)
format_option = click.option(
    "--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True
)


def engine_options(spark_help: str) -> Callable[[click.Command], click.Command]:
    """``--engine local|spark`` and ``--partitions``, for the commands that can run on Spark."""

    def decorate(command: click.Command) -> click.Command:
        command = click.option(
            "--partitions", type=int, default=None, help="With --engine spark: number of partitions."
        )(command)
        return click.option(
            "--engine", type=click.Choice(["local", "spark"]), default="local", show_default=True, help=spark_help
        )(command)

    return decorate


def level_option(flag: str, default: float, help_text: str) -> Callable[[click.Command], click.Command]:
    """An option for a level strictly between 0 and 1 (a confidence, a power), its default shown."""
    return click.option(
        flag, type=click.FloatRange(0, 1, min_open=True, max_open=True), default=default, show_default=True,
        help=help_text,
    )  # fmt: skip


READER_ENVIRONMENT = {"OPENBLAS_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
"""Where ``compare`` and ``generations`` start numpy: they do no linear algebra, and numba's kernels
share the cores with pyarrow's parser threads, so OpenBLAS's threads (numpy's, and scipy's, which
numba loads) and numba's idle OpenMP workers would only spin: 7-9% of a compare's CPU time on 400k
rows, 2% of its wall time, on 2 cores."""


def reader_threads() -> None:
    """Set :data:`READER_ENVIRONMENT` where the environment does not, in a process that has not
    loaded numpy yet (a command's own, not a caller's that goes on to train a model)."""
    if "numpy" not in sys.modules:
        for name, value in READER_ENVIRONMENT.items():
            os.environ.setdefault(name, value)


def named_files(items: tuple[str, ...], option: str) -> dict[str, str]:
    """``NAME=FILE`` items of a repeated option as {name: file}; a malformed or repeated name is a usage error."""
    named: dict[str, str] = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise click.BadParameter(f"{item!r}: expected NAME=FILE", param_hint=option)
        if name in named:
            raise click.BadParameter(f"name {name!r} is given twice", param_hint=option)
        named[name] = path
    return named
