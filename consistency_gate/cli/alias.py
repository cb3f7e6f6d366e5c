"""The moves of ``@champion`` a person makes (gate/alias.py): ``rollback`` (back to the champion before) and
``authorize`` (to a version on purpose, recorded so that the guard of ``consistency-gate watch`` leaves it)."""

from __future__ import annotations

import getpass
from pathlib import Path

import click

from consistency_gate.cli.common import echo_json, format_option, report_option, tracking_uri_option


def _words(value: str | None, option: str) -> str | None:
    """A reason or a name as given, refused when it says nothing (empty or blanks): a record of a move says why."""
    if value is not None and not value.strip():
        raise click.BadParameter("is empty: say it in words (it is recorded in the run, the tags and the version's "
                                 "description)", param_hint=option)  # fmt: skip
    return value


@click.command()
@click.option("--model", required=True, help="Registered model name.")
@click.option("--to", default=None, help="The version to restore (default: the champion before, from the gates).")
@click.option("--reason", default="rolled back by hand", show_default=True, help="Why, for the tags and descriptions.")
@tracking_uri_option
@report_option
@format_option
def rollback(
    model: str, to: str | None, reason: str, tracking_uri: str | None, report_path: Path | None, fmt: str
) -> int:
    """Move @champion back to the champion before it, verified and read back like a promotion."""
    from consistency_gate.gate.alias import rollback as roll_back

    reason = _words(reason, "--reason")
    return said_alias_move(roll_back(model, tracking_uri, to, reason, report_path), fmt)


@click.command()
@click.option("--model", required=True, help="Registered model name.")
@click.option("--version", required=True, help="The version that may hold @champion.")
@click.option("--reason", required=True, help="Why, for the run, the tags and the version's description.")
@click.option("--by", default=None, help="Who authorizes it (default: the user running the command).")
@tracking_uri_option
@report_option
@format_option
def authorize(
    model: str, version: str, reason: str, by: str | None, tracking_uri: str | None, report_path: Path | None, fmt: str
) -> int:
    """Move @champion to a version on purpose, recorded so that `watch` does not undo it."""
    from consistency_gate.gate.alias import authorize as move

    reason, by = _words(reason, "--reason"), _words(by, "--by")
    return said_alias_move(move(model, tracking_uri, version, reason, by or getpass.getuser(), report_path), fmt)


def said_alias_move(report: dict, fmt: str) -> int:
    """Print a move of the alias (rollback, authorize) as JSON or a line and its warnings; its exit code, a
    promotion's (0 when nothing had to move: a retried rollback)."""
    from consistency_gate.mlops.promotion import Promotion
    from consistency_gate.report.live import alias_move_text

    if fmt == "json":
        echo_json(report)
    else:
        click.echo(alias_move_text(report))
        for warning in report.get("warnings") or []:
            click.echo(f"warning: {warning}", err=True)
    if report["promotion"] is None:  # a retry: the alias already holds what the last rollback restored
        return 0
    return Promotion(**report["promotion"]).exit_code
