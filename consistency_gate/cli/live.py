"""The commands on live traffic: ``shadow serve`` (the champion answers, the candidate's answers captured beside)
and ``shadow check`` (a candidate judged on a capture as labels arrive)."""

from __future__ import annotations

import os
from pathlib import Path

import click

from consistency_gate.cli.common import echo_json, format_option, report_option, tracking_uri_option

EXIT_BY_DECISION = {"promote": 0, "continue": 0, "reject": 1}


@click.group()
def shadow() -> None:
    """Gate a candidate on live traffic: the answers both models gave to served requests, and labels as they arrive."""


@shadow.command("serve")
@click.option("--model", required=True, help="Registered model name.")
@click.option("--candidate", default=None, help="The version to shadow: a number or @alias (default: latest).")
@click.option("--champion", default=None, help="The version that answers (default @champion).")
@click.option(
    "--capture", required=True, type=click.Path(path_type=Path), help="Folder of the capture's Parquet parts."
)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=click.IntRange(0, 65535), default=5001, show_default=True)
@click.option("--roll-rows", type=click.IntRange(min=1), default=10_000, show_default=True, help="Rows per part.")
@click.option(
    "--roll-seconds", type=click.FloatRange(min=0.1), default=60.0, show_default=True, help="Seconds per part."
)
@click.option("--candidate-timeout", type=click.FloatRange(min=0.01), default=10.0, show_default=True,
              help="Seconds the candidate may take on a request before it counts as failed.")  # fmt: skip
@click.option("--drain-seconds", type=click.FloatRange(min=0), default=60.0, show_default=True,
              help="On stop, seconds to score the requests still queued for the candidate.")  # fmt: skip
@click.option(
    "--journal/--no-journal", default=True, show_default=True,
    help="Journal the answered requests (group commit, off the request path) so a crash of the server loses at most "
    "the last group; --no-journal: a crash loses the rows not yet in a part.",
)  # fmt: skip
@click.option(
    "--journal-seconds", type=click.FloatRange(min=0.001, max=1), default=0.02, show_default=True,
    help="The journal's group: the requests answered in this time are appended in one write (what a crash can lose; "
    "longer: fewer wake-ups of the writer's thread).",
)  # fmt: skip
@click.option(
    "--candidate-nice", type=click.IntRange(0, 19), default=10, show_default=True,
    help="How much lower the candidate's process runs than the champion's (Unix nice): on busy cores the champion "
    "goes first and the candidate catches up when they are free; 0: the same priority.",
)  # fmt: skip
@click.option(
    "--candidate-idle", is_flag=True,
    help="Linux: run the candidate in the idle scheduling class, on the CPU nothing else wants (closer to the "
    "champion alone on saturated cores; under sustained saturation it falls behind: past 10,000 queued requests "
    "they are captured as not scored, and a batch waiting past --candidate-timeout restarts it).",
)  # fmt: skip
@click.option(
    "--candidate-batch-seconds", type=click.FloatRange(min=0), default=0.1, show_default=True,
    help="The candidate scores the requests answered in this time in one call (less CPU per request than a call "
    "each, on the cores the champion shares); 0: as soon as it is free.",
)  # fmt: skip
@click.option("--classes", default=None, help="Class names in the order of the models' scores (a,b,c).")
@tracking_uri_option
def shadow_serve(
    model: str, candidate: str | None, champion: str | None, capture: Path, host: str, port: int, roll_rows: int,
    roll_seconds: float, candidate_timeout: float, drain_seconds: float, journal: bool, journal_seconds: float,
    candidate_nice: int, candidate_idle: bool, candidate_batch_seconds: float, classes: str | None,
    tracking_uri: str | None,
) -> int:  # fmt: skip
    """Answer with the champion on MLflow's scoring protocol (POST /invocations), score the candidate off the
    request path, and capture both answers (id, time, champion, candidate) until SIGTERM."""
    from consistency_gate.gate.live import shadow_serve as run_server
    from consistency_gate.io.capture_writer import capture_folder
    from consistency_gate.mlops.shadow_server import ServeOptions

    capture_folder(capture)  # a file where the folder should be: one line, before any model loads
    if candidate_idle and not hasattr(os, "SCHED_IDLE"):
        raise click.UsageError("--candidate-idle needs Linux's idle scheduling class; use --candidate-nice here")
    names = tuple(c.strip() for c in classes.split(",")) if classes else None
    options = ServeOptions(
        host, port, roll_rows, roll_seconds, candidate_timeout, drain_seconds, journal, candidate_nice, candidate_idle,
        candidate_batch_seconds, journal_seconds,
    )  # fmt: skip
    summary = run_server(model, candidate, champion, capture, tracking_uri, options, names)
    return 5 if summary["fallback"] else 0  # rows the capture folder would not take went elsewhere: said above


@shadow.command("check")
@click.option("--model", required=True, help="Registered model name.")
@click.option("--candidate", default=None, help="The version served in shadow: a number or @alias (default: latest).")
@click.option("--baseline", default=None, help="What it was shadowed against (default @champion).")
@click.option(
    "--capture",
    required=True,
    type=click.Path(path_type=Path),
    help="The capture: a CSV/Parquet table or folder (id, time, champion, candidate), or the production "
    "variant's SageMaker Data Capture (JSON Lines) with --shadow-capture.",
)
@click.option(
    "--shadow-capture",
    default=None,
    type=click.Path(path_type=Path),
    help="SageMaker: the shadow variant's Data Capture (file or folder of JSON Lines).",
)
@click.option(
    "--labels",
    required=True,
    type=click.Path(path_type=Path),
    help="Labels as they arrived: CSV/Parquet file or folder (id, label, optional time).",
)
@click.option("--config", "config_path", default=None, type=click.Path(path_type=Path), help="Gate rules (YAML).")
@click.option("--batch", type=click.IntRange(min=1), default=None, help="Labels per look (default 100).")
@click.option("--classes", default=None, help="Class names in the order of scores in a capture (a,b,c).")
@click.option("--promote", is_flag=True, help="On promote, move @champion to the candidate (verified, read back).")
@click.option(
    "--watch",
    is_flag=True,
    help="The candidate is the champion now and --baseline the one it replaced: roll back on reject.",
)
@tracking_uri_option
@report_option
@format_option
def shadow_check(
    model: str,
    candidate: str | None,
    baseline: str | None,
    capture: Path,
    shadow_capture: Path | None,
    labels: Path,
    config_path: Path | None,
    batch: int | None,
    classes: str | None,
    promote: bool,
    watch: bool,
    tracking_uri: str | None,
    report_path: Path | None,
    fmt: str,
) -> int:
    """Judge the candidate's flips on live traffic with anytime-valid bounds: promote, reject, or continue.

    Exit 0 on promote (and on continue: nothing decided yet; the report's passed_version stays null),
    1 on reject.
    """
    from consistency_gate.errors import UsageError
    from consistency_gate.gate.config import load_config
    from consistency_gate.gate.live import ShadowInputs, shadow_check
    from consistency_gate.gate.shadow import DEFAULT_BATCH

    if promote and watch:
        raise UsageError("--promote and --watch: give one (promote a candidate, or watch a promoted champion)")
    if watch and baseline is None:
        raise UsageError("--watch needs --baseline VERSION: the champion the watched model replaced")
    names = tuple(c.strip() for c in classes.split(",")) if classes else None
    inputs = ShadowInputs(model, candidate, capture, shadow_capture, labels, baseline, batch or DEFAULT_BATCH, names)
    report = shadow_check(inputs, load_config(config_path), tracking_uri, promote, watch, report_path)
    if fmt == "json":
        echo_json(report)
    else:
        from consistency_gate.report.live import stream_text

        click.echo(stream_text(report))
    move = report.get("rollback") or report["promotion"]
    if move and move["promoted"] is not True:  # asked for and not read back: refused (4) or unknown (5)
        from consistency_gate.mlops.promotion import Promotion

        return Promotion(**move).exit_code
    return EXIT_BY_DECISION[report["decision"]]
