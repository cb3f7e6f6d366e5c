"""Errors that carry the exit code of SPEC section 6.

Every failure the user can act on is one of these; the CLI prints its message on one
line and exits with its code. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class GateError(Exception):
    """Base class: a one-line, actionable message and an exit code."""

    exit_code = 1


class UsageError(GateError):
    """Wrong command-line usage or an invalid configuration (exit 2)."""

    exit_code = 2


class DataError(GateError):
    """Invalid input data: a file, a column or a value (exit 3)."""

    exit_code = 3


class ModelError(GateError):
    """Model or registry problem: name, version, alias or flavor (exit 4)."""

    exit_code = 4


class TrackingError(GateError):
    """Tracking server or artifact storage unreachable (exit 5)."""

    exit_code = 5
