"""The JSON report's schema: ``report.schema.json``, shipped in the package.

``consistency-gate report-schema`` prints it; every report carries ``schema_version``, which
changes when a key is removed or changes meaning (added keys keep the version).

>>> report_schema()["oneOf"][0]["properties"]["schema_version"]["const"] == SCHEMA_VERSION
True
"""

from __future__ import annotations

import json
from importlib import resources

from consistency_gate.core import names

SCHEMA_VERSION = "1"


def report_schema(which: str = "report") -> dict:
    """The JSON Schema (draft 2020-12) of the gate's report and of its error report, or with
    ``which="history"`` of ``consistency-gate history --format json``.

    The report's ``metrics`` (the gate's, a repair's) are the names of :mod:`consistency_gate.core.names`,
    read here, so a metric the counts gain is a key the schema knows, and a key nobody listed is refused.

    >>> report_schema("history")["title"]
    'consistency-gate history'
    >>> metrics = report_schema()["$defs"]["metrics"]
    >>> "ctoi" in metrics["properties"], metrics["additionalProperties"]
    (True, False)
    """
    schema = json.loads(resources.files("consistency_gate.report").joinpath(f"{which}.schema.json").read_text())
    if which == "report":
        schema["$defs"]["metrics"] |= metrics_schema()
    return schema


def metrics_schema() -> dict:
    """The ``metrics`` object of a report: each name of :data:`~consistency_gate.core.names.REPORTED`, the
    top-k metrics per k (:data:`~consistency_gate.core.names.PER_K`), each a number or null.

    >>> sorted(metrics_schema()["patternProperties"])
    ['^(ccon|cacc_previous|cacc_candidate|cacc)@([1-9][0-9]*)$']
    """
    value = {"type": ["number", "null"]}
    return {
        "properties": {name: value for name in names.REPORTED},
        "patternProperties": {names.PER_K.pattern: value},
        "additionalProperties": False,
    }
