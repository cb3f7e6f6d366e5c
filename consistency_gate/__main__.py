"""``python -m consistency_gate``: the command line."""

from consistency_gate.cli import run

run()
