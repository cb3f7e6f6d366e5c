"""The JSON report's schema: ``report.schema.json``, shipped in the package.

``consistency-gate report-schema`` prints it; every report carries ``schema_version``, which
changes when a key is removed or changes meaning (added keys keep the version).

>>> report_schema()["oneOf"][0]["properties"]["schema_version"]["const"] == SCHEMA_VERSION
True
"""

from __future__ import annotations

import json
from importlib import resources

SCHEMA_VERSION = "1"


def report_schema(which: str = "report") -> dict:
    """The JSON Schema (draft 2020-12) of the gate's report and of its error report, or with
    ``which="history"`` of ``consistency-gate history --format json``.

    >>> report_schema("history")["title"]
    'consistency-gate history'
    """
    return json.loads(resources.files("consistency_gate.report").joinpath(f"{which}.schema.json").read_text())
