"""``consistency-gate watch``: the listener that keeps every version of the watched models gated once and
``@champion`` on an authorized version (gate/watch.py), woken by MLflow's webhooks or by its own timer."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import click

from consistency_gate.cli.common import tracking_uri_option
from consistency_gate.errors import UsageError

WEBHOOK_NAME = "consistency-gate-watch"
DEFAULT_POLL_S = 30.0  # a registry that sends no webhooks is read this often unless --poll says otherwise


@click.command()
@click.option("--config", "config_path", required=True, type=click.Path(path_type=Path),
              help="The watch config (YAML): the models, their data and gate configs; see docs/watch.md.")  # fmt: skip
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (webhooks, /health).")
@click.option("--port", type=click.IntRange(0, 65535), default=8787, show_default=True)
@click.option("--register", "register_url", default=None,
              help="Register the webhook on the tracking server, delivering to this URL (this listener's, as the "
                   "server reaches it); without it, print how to.")  # fmt: skip
@click.option("--poll", "poll_s", type=click.FloatRange(min=1), default=None, metavar="SECONDS",
              help="Read the registry every SECONDS instead of taking webhooks (no secret): for a registry that "
                   f"sends none (sqlite:///, a file store, Unity Catalog; {DEFAULT_POLL_S:g} s there by "
                   "default).")  # fmt: skip
@tracking_uri_option
def watch(
    config_path: Path, host: str, port: int, register_url: str | None, poll_s: float | None, tracking_uri: str | None
) -> int:
    """Keep every new version gated once and @champion on a gated version: woken by webhooks, or polling."""
    from consistency_gate.gate.watch import Watcher, load_watch_config
    from consistency_gate.mlops import webhooks
    from consistency_gate.mlops.store import resolve_tracking_uri

    config = load_watch_config(config_path)
    unsent = webhooks.webhooks_unsent(resolve_tracking_uri(tracking_uri or config.tracking_uri))
    if register_url and (poll_s or unsent):
        raise UsageError(
            f"--register: {unsent}, so it cannot deliver a webhook; leave --register out: watch polls it"
            if unsent
            else "--register and --poll: a listener that polls takes no webhook; give one of them"
        )
    if poll_s is None and unsent:
        poll_s = DEFAULT_POLL_S
        click.echo(f"{unsent}: polling it every {poll_s:g} s (--poll SECONDS to choose)", err=True)
    secret = "" if poll_s else os.environ.get(config.secret_env, "")
    if not poll_s and not secret:
        raise UsageError(
            f"the environment variable {config.secret_env} (the watch config's secret_env) holds no secret: set it to "
            "the webhook's secret, the one the tracking server signs deliveries with (or watch with --poll SECONDS)"
        )
    watcher = Watcher(config, tracking_uri, echo=lambda line: click.echo(line), poll_s=poll_s)
    watcher.check()
    deliveries = webhooks.Deliveries(secret) if secret else None
    status = (lambda: {**watcher.status(), "rejected": list(deliveries.rejected)}) if deliveries else watcher.status
    # bound before the webhook is touched: a start that cannot listen changes nothing a running listener relies on
    server = webhooks.listener(host, port, deliveries, watcher.on_event, status, lambda line: click.echo(line))
    if register_url:
        hook = webhooks.register(watcher.client, WEBHOOK_NAME, register_url, secret)
        click.echo(f"webhook {hook} delivers {', '.join(webhooks.EVENTS)} to {register_url}")
        # the server's workers cache each event's webhooks (MLFLOW_WEBHOOK_CACHE_TTL there): what is registered in
        # that time is not delivered, so every model is reconciled once the cache has expired
        watcher.reconcile_in(config.webhook_cache_s + 1, "the tracking server's webhook cache expired")
    elif not poll_s:
        click.echo(
            "register the webhook once: consistency-gate watch ... --register http://<this host>:"
            f"{port}/webhook (or MlflowClient().create_webhook(name=..., url=..., events={list(webhooks.EVENTS)}, "
            f"secret=os.environ[{config.secret_env!r}]))",
            err=True,
        )

    def stop(signum: int, frame: object) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    watcher.start()
    click.echo(
        f"listening on http://{host}:{server.server_address[1]} for {', '.join(watcher.models)} ({watcher.mode}; "
        f"lease holder {watcher.holder})",
        err=True,
    )
    try:
        server.serve_forever()
    finally:
        server.server_close()
        watcher.stop()
    return 0
