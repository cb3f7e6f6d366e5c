"""The commands on a gate config: ``config`` (without a model or a server, or checked against a model), ``plan`` and
``report-schema``."""

from __future__ import annotations

import json
from pathlib import Path

import click

from consistency_gate.cli.common import echo_json, level_option, tracking_uri_option
from consistency_gate.errors import UsageError


@click.command("report-schema")
@click.option("--history", "of_history", is_flag=True, help="The schema of `history --format json` instead.")
def report_schema(of_history: bool) -> None:
    """Print the JSON Schema of the --report / --format json report (its schema_version is in every report)."""
    from consistency_gate.report.schema import report_schema as schema

    click.echo(json.dumps(schema("history" if of_history else "report"), indent=2))


@click.command()
@click.option("--default", "show_default", is_flag=True, help="Print the packaged default config.")
@click.option(
    "--check",
    "check_path",
    type=click.Path(path_type=Path),
    default=None,
    help="Validate a config (rules and remediation); with --model, also against that model.",
)
@click.option("--model", default=None, help="With --check: the registered model the config will gate.")
@click.option("--candidate", default=None, help="With --model: the candidate version (default: the latest).")
@click.option("--baseline", default="@champion", show_default=True, help="With --model: the previous generation.")
@click.option(
    "--data",
    default=None,
    type=click.Path(path_type=Path),
    help="With --model: the evaluation data (one row is predicted; default: the model's logged input example).",
)
@click.option("--label-column", default="label", show_default=True)
@click.option("--id-column", default=None)
@tracking_uri_option
def config(
    show_default: bool,
    check_path: Path | None,
    model: str | None,
    candidate: str | None,
    baseline: str,
    data: Path | None,
    label_column: str,
    id_column: str | None,
    tracking_uri: str | None,
) -> None:
    """Print the default gate configuration (YAML), or check one (against a model, with --model)."""
    from consistency_gate.ensembles.methods import resolve
    from consistency_gate.gate.config import default_config_text, load_config

    if show_default == (check_path is not None):
        raise click.UsageError("give exactly one of --default and --check FILE")
    if model is None and (candidate or data or baseline != "@champion"):
        raise click.UsageError("--candidate, --baseline and --data check the config against a model: give --model")
    if show_default:
        if model is not None:
            raise click.UsageError("--model checks a config: give --check FILE")
        click.echo(default_config_text(), nl=False)
        return
    cfg = load_config(check_path)
    against = []
    if model is not None:
        from consistency_gate.gate.fit import check_against_model

        against = check_against_model(cfg, model, tracking_uri, candidate, baseline, data, label_column, id_column)
    click.echo(f"{check_path}: valid; {len(cfg.rules)} rules, ks {list(cfg.ks)}")
    for rule in cfg.rules:
        click.echo(f"  {rule.describe()}")
    if cfg.remediation is not None:
        remediation = cfg.remediation
        data = (
            f"recipe {remediation.recipe}, training data {remediation.data}"
            if remediation.can_train
            else "no training data: the methods that train are skipped"
        )
        click.echo(f"  remediation: {' then '.join(remediation.methods)}; {data}")
        for name in remediation.methods:
            click.echo(f"    {name}: {resolve(name).summary(remediation.for_method(name))}")
        if remediation.calibration is not None:
            click.echo(f"  repairs tuned on {remediation.calibration}")
        elif remediation.tuning_share is not None:
            click.echo(
                f"  repairs tuned on {remediation.tuning_share:.0%} of the evaluation set held out by id "
                "(tuning_share), never judged on"
            )
        if remediation.max_models is not None:
            click.echo(f"  at most {remediation.max_models} models in what remediation registers (max_models)")
    for line in against or [
        "not checked against a model: the classes it answers in (ks, top-k rules, decision:) and whether it gives "
        "class scores (pearson, cosine, top-k rules); give --model NAME to check them"
    ]:
        click.echo(line)


@click.command()
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
@level_option("--power", 0.8, "The chance that the rule gives the right answer for a model at the expected rate.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def plan(rules_path: Path, rates: tuple[str, ...], confidence: float | None, power: float, fmt: str) -> None:
    """How many evaluation samples each rule needs to pass a model at the rate you expect (before building a set)."""
    from consistency_gate.gate.config import load_config
    from consistency_gate.gate.rules import plan_sizes
    from consistency_gate.report.text import fmt_share, table

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
        echo_json({"confidence": level, "power": power, "rules": rows})
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
