"""The registry's own commands: ``watch`` (a listener of MLflow's webhooks that gates new versions and guards
``@champion``) and ``authorize`` (a person's move of ``@champion``, recorded so that the guard leaves it)."""

from __future__ import annotations

import getpass
import os
import signal
import threading
from pathlib import Path

import click

from consistency_gate.cli.common import tracking_uri_option
from consistency_gate.cli.live import format_option, report_option, said_alias_move
from consistency_gate.errors import UsageError

WEBHOOK_NAME = "consistency-gate-watch"


@click.command()
@click.option("--config", "config_path", required=True, type=click.Path(path_type=Path),
              help="The watch config (YAML): the models, their data and gate configs; see docs/watch.md.")  # fmt: skip
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=int, default=8787, show_default=True)
@click.option("--register", "register_url", default=None,
              help="Register the webhook on the tracking server, delivering to this URL (this listener's, as the "
                   "server reaches it); without it, print how to.")  # fmt: skip
@tracking_uri_option
def watch(config_path: Path, host: str, port: int, register_url: str | None, tracking_uri: str | None) -> int:
    """Listen to the registry's webhooks: gate each new version, keep @champion on a gated version."""
    from consistency_gate.gate.watch import Watcher, load_watch_config
    from consistency_gate.mlops import webhooks

    config = load_watch_config(config_path)
    secret = os.environ.get(config.secret_env, "")
    if not secret:
        raise UsageError(
            f"the environment variable {config.secret_env} (the watch config's secret_env) holds no secret: set it to "
            "the webhook's secret, the one the tracking server signs deliveries with"
        )
    watcher = Watcher(config, tracking_uri, echo=lambda line: click.echo(line))
    watcher.check()
    if register_url:
        hook = webhooks.register(watcher.client, WEBHOOK_NAME, register_url, secret)
        click.echo(f"webhook {hook} delivers {', '.join(webhooks.EVENTS)} to {register_url}")
    else:
        click.echo(
            "register the webhook once: consistency-gate watch ... --register http://<this host>:"
            f"{port}/webhook (or MlflowClient().create_webhook(name=..., url=..., events={list(webhooks.EVENTS)}, "
            f"secret=os.environ[{config.secret_env!r}]))",
            err=True,
        )
    deliveries = webhooks.Deliveries(secret)
    server = webhooks.listener(host, port, deliveries, watcher.on_event,
                               lambda: {**watcher.status(), "rejected": list(deliveries.rejected)})  # fmt: skip

    def stop(signum: int, frame: object) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    watcher.start()
    click.echo(f"listening on http://{host}:{server.server_address[1]} for {', '.join(watcher.models)}", err=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
        watcher.stop()
    return 0


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

    return said_alias_move(move(model, tracking_uri, version, reason, by or getpass.getuser(), report_path), fmt)
