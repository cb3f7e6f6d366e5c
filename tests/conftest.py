import json
import subprocess
import sys
from pathlib import Path

import pytest

import __main__

# The suite runs on two workers (pytest-xdist, see pyproject.toml). A worker's __main__ has neither
# __spec__ nor __file__, which pyspark (imported by great-expectations) takes for a doctest run of its
# own, and exits; a file name tells it otherwise.
if getattr(__main__, "__spec__", None) is None and not hasattr(__main__, "__file__"):
    __main__.__file__ = "<pytest-xdist worker>"


def assert_valid_report(report: dict) -> dict:
    """Fail unless ``report`` validates against the report schema shipped in the package."""
    import jsonschema

    from consistency_gate.report.schema import report_schema

    jsonschema.Draft202012Validator(report_schema()).validate(json.loads(json.dumps(report, default=str)))
    return report


def read_report(path: Path) -> dict:
    """A ``--report`` file, validated against the shipped schema."""
    return assert_valid_report(json.loads(Path(path).read_text()))


@pytest.fixture(autouse=True)
def _reports_match_the_schema(monkeypatch):
    """Every report a test makes in-process (``GateResult.to_dict``) is validated against the schema."""
    from consistency_gate.gate.result import GateResult

    to_dict = GateResult.to_dict
    monkeypatch.setattr(GateResult, "to_dict", lambda self: assert_valid_report(to_dict(self)))


def run_cli(*args: str, cwd: Path | None = None, env: dict | None = None, timeout: float = 300):
    """Run ``consistency-gate`` as a subprocess; returns the CompletedProcess."""
    return subprocess.run(
        [sys.executable, "-m", "consistency_gate", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=timeout,
    )


def start_cli(*args: str, env: dict | None = None) -> subprocess.Popen:
    """Start ``consistency-gate`` in the background, capturing its output as text."""
    return subprocess.Popen(
        [sys.executable, "-m", "consistency_gate", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def run_json(*args: str, **kw):
    proc = run_cli(*args, **kw)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture
def cli():
    return run_cli
