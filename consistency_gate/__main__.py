"""``python -m consistency_gate``: the command line."""

from consistency_gate.cli.app import run

run()
