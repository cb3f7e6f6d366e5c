"""Errors that carry the command-line exit codes.

Every failure the user can act on is one of these; the CLI prints its message on one
line and exits with its code. Anything else is a bug: the CLI prints it on one line as an
internal error and exits with ``INTERNAL_ERROR`` (6), never 1, which CI reads as "the gate
failed"; ``--verbose`` adds the traceback.
"""

from __future__ import annotations

import re

# the password (or token) of a URI's user:password@ part, anywhere in a text
_USERINFO = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://)([^\s/]+)@")


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def redact_credentials(text: str) -> str:
    """``text`` fit to print or log: in every URI, the password of ``user:password@`` becomes
    ``***``, and a user part without a password (a token, ``https://TOKEN@host``) becomes ``***``.

    >>> redact_credentials("https://alice:s3cret@mlflow.example.com/ refused")
    'https://alice:***@mlflow.example.com/ refused'
    >>> redact_credentials("postgresql://mlflow:p@ss@db:5432/x"), redact_credentials("sqlite:///mlflow.db")
    ('postgresql://mlflow:***@db:5432/x', 'sqlite:///mlflow.db')
    >>> redact_credentials("View run at: https://ghp_T0KEN@mlflow.example.com/#/runs/1 (a@b.c)")
    'View run at: https://***@mlflow.example.com/#/runs/1 (a@b.c)'
    """

    def hide(match: re.Match) -> str:
        user, password = match.group(2).split(":", 1) if ":" in match.group(2) else ("", None)
        return f"{match.group(1)}{user}:***@" if password is not None else f"{match.group(1)}***@"

    return _USERINFO.sub(hide, text)


def error_line(exc: BaseException, limit: int = 300) -> str:
    """An exception as ``Type: message`` on one line, credentials redacted, cut at ``limit`` characters.

    >>> error_line(OSError("cannot reach http://alice:s3cret@mlflow:5000/api\\nmore"), 80)
    'OSError: cannot reach http://alice:***@mlflow:5000/api more'
    """
    return f"{type(exc).__name__}: {one_line(redact_credentials(str(exc)))[:limit]}"


def one_line(text: str) -> str:
    """A message as one line: newlines and other control characters (a newline in a model name, an
    escape sequence in a class label) as a space, so no input can start a line of its own.

    >>> one_line("model 'a\\nFAKE: PASSED' not found")
    "model 'a FAKE: PASSED' not found"
    """
    return _CONTROL.sub(" ", text)


def redact_logs() -> None:
    """Redact credentials (:func:`redact_credentials`) in every log record of this process from now
    on, the libraries' included: MLflow's own "View run ... at: URL" line prints the tracking URI
    as given, password and all.

    Example::

        redact_logs()  # once, at the start of the CLI
    """
    import logging

    make = logging.getLogRecordFactory()
    if getattr(make, "redacts", False):
        return

    def redacted(*args: object, **kwargs: object) -> logging.LogRecord:
        record = make(*args, **kwargs)
        message = record.getMessage()
        if "@" in message:
            record.msg, record.args = redact_credentials(message), None
        return record

    redacted.redacts = True
    logging.setLogRecordFactory(redacted)


def plain(value: object) -> str:
    """A value for an error message: numpy scalars as the plain Python value they hold.

    >>> import numpy as np
    >>> plain(np.float64(-0.135)), plain("id-7"), plain(np.int64(3))
    ('-0.135', "'id-7'", '3')
    """
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "ndim", None) == 0:
        value = item()
    return repr(value)


# exit code of an internal error (a bug): never a verdict, never a promotion
INTERNAL_ERROR = 6


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
