"""Files a command writes its results to (``--report``, ``--summary``), checked before any work."""

from __future__ import annotations

import os
from pathlib import Path

from consistency_gate.errors import UsageError


def check_writable(path: str | Path, option: str) -> Path:
    """``path`` as a Path, or a UsageError (exit 2) naming ``option`` when the result could not be
    written there: a folder, a missing parent folder, or no permission. Checked before a gate does
    any work, so a gate never moves an alias and then fails to say so.

    >>> check_writable("/no/r.json", "--report")
    Traceback (most recent call last):
    ...
    consistency_gate.errors.UsageError: --report /no/r.json: the folder /no does not exist; create it or write elsewhere
    """
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"{option} {path}: is a folder; give a file name, e.g. {path / 'report.json'}")
    parent = path.parent
    if not parent.is_dir():
        raise UsageError(f"{option} {path}: the folder {parent} does not exist; create it or write elsewhere")
    writable = os.access(path, os.W_OK) if path.exists() else os.access(parent, os.W_OK | os.X_OK)
    if not writable:
        raise UsageError(f"{option} {path}: not writable by this user; fix its permissions or write elsewhere")
    return path
