"""The ``consistency-gate`` command: parses arguments, calls the core, prints results (:mod:`.app`)."""

from consistency_gate.cli.app import cli, main, run

__all__ = ["cli", "main", "run"]
