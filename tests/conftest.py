import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import __main__

# The suite's parallelism is its two workers (pytest-xdist, see pyproject.toml); each worker's numba OpenMP
# threads spinning while they wait (the OpenMP default) took the cores from the other worker: the metric
# property tests ran 15x slower beside each other (136 s vs 9 s). What `compare` sets in its own process
# (cli/common.READER_ENVIRONMENT), set here before numpy and numba load; a setting of the caller's wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# The local Spark session's JVM (test_spark.py: a few seconds of work a test) compiled with the C1 compiler only and
# the serial collector: the optimizing compiler's threads spent a quarter of the JVM's CPU on code that ran for
# seconds (test_spark.py alone: 79 s of CPU against 108 s, 69 s against 79 s in its tests).
# What pyspark's launcher reads when it starts the JVM; a setting of the caller's wins.
os.environ.setdefault(
    "PYSPARK_SUBMIT_ARGS", "--driver-java-options '-XX:TieredStopAtLevel=1 -XX:+UseSerialGC' pyspark-shell"
)

# The suite runs on two workers (pytest-xdist, see pyproject.toml). A worker's __main__ has neither
# __spec__ nor __file__, which pyspark (imported by great-expectations) takes for a doctest run of its
# own, and exits; a file name tells it otherwise.
if getattr(__main__, "__spec__", None) is None and not hasattr(__main__, "__file__"):
    __main__.__file__ = "<pytest-xdist worker>"


# the modules that take longest (their tests' seconds on 2 cores summed, `--durations=0`), scheduled first: the
# workers take work in collection order (`--no-loadscope-reorder`), and a long module handed out last keeps one
# worker busy while the other waits
LONGEST_FIRST = (
    "test_watch.py", "test_safety.py", "test_spark.py", "test_docs_pages.py", "test_shipping.py",
    "test_real_server.py", "test_tensor_models.py", "test_reliability.py", "test_shadow_server.py",
    "test_memory_gate.py", "test_docs.py", "test_correctness_gate.py", "test_repair_gate.py", "test_gate.py",
    "test_compare_cli.py", "test_flavors.py", "test_file_gate.py", "test_remediation.py", "test_history_registry.py",
    "test_generations_registry.py", "test_watch_poll.py", "test_default_config.py",
)  # fmt: skip


# the kernel that takes two thirds of a cold compile (25 of 37 s on 2 cores), compiled beside the others
LONGEST_KERNEL = "pair_top_k_moments"


def pytest_configure(config) -> None:
    """Numba's kernels compiled into the cache once, by the process that starts the workers, before they
    start (1 s when the cache is warm, 40 s cold). On a fresh clone's cold cache, every worker and every
    command a test starts before the cache is written would otherwise compile the same kernels at once.
    The longest kernel compiles in a process of its own beside the others (25 s instead of 37 s cold)."""
    if not hasattr(config, "workerinput"):  # the controller, or a run without workers
        _check_groups_work(config)
        from consistency_gate.core import kernels

        code = f"from consistency_gate.core.kernels import precompile; precompile(names={{{LONGEST_KERNEL!r}}})"
        beside = subprocess.Popen([sys.executable, "-c", code])
        kernels.precompile(names=set(kernels.kernel_names()) - {LONGEST_KERNEL})
        assert beside.wait() == 0, "compiling numba's kernels failed"


def _check_groups_work(config) -> None:
    """A usage error where pytest-xdist cannot keep a module's tests on one worker: pytest 9.2's node ids do not
    take pytest-xdist 3.8's group names, so its module fixtures would be built on both workers and its ordered
    tests run apart (pyproject.toml's dev extra keeps pytest below 9.2)."""
    from packaging.version import Version

    if config.getoption("dist", "no") == "loadgroup" and Version(pytest.__version__) >= Version("9.2"):
        raise pytest.UsageError(
            f"pytest {pytest.__version__} with pytest-xdist's --dist loadgroup runs a module's tests on both "
            'workers; install the dev extra\'s versions (python -m pip install -e ".[dev]": pytest below 9.2)'
        )


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list) -> None:
    """The longest modules first (:data:`LONGEST_FIRST`), each module's tests in their own order; the tests
    of a module that shares a fixture across its tests (``scope="module"``: a store, a server, a trained
    model) in one group, so one worker builds it once (`--dist loadgroup`); every other test goes to
    whichever worker is free."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(Path(str(item.fspath)).name, len(rank)))
    for item in items:
        if _shares_a_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(Path(str(item.fspath)).name))


def _shares_a_module_fixture(item) -> bool:
    info = getattr(item, "_fixtureinfo", None)  # doctests have none
    definitions = info.name2fixturedefs.values() if info is not None else ()
    return any(fixture.scope == "module" for chain in definitions for fixture in chain)


def assert_valid_report(report: dict) -> dict:
    """Fail unless ``report`` validates against the report schema shipped in the package."""
    import jsonschema

    from consistency_gate.report.schema import report_schema

    jsonschema.Draft202012Validator(report_schema()).validate(json.loads(json.dumps(report, default=str)))
    return report


def read_report(path: Path) -> dict:
    """A ``--report`` file, validated against the shipped schema."""
    return assert_valid_report(json.loads(Path(path).read_text()))


@pytest.fixture(autouse=True, scope="module")
def _no_tracking_uri_from_an_earlier_module():
    """Each test module starts as a fresh process would, without the tracking and registry URIs an earlier module
    of its worker set: ``mlflow.set_tracking_uri`` also sets MLFLOW_TRACKING_URI, which every CLI run (in this
    process or not) then reads, and the store or server it names may be gone (a test met one on a busy machine,
    where the tests ran in another order)."""
    import mlflow
    from mlflow.tracking._model_registry import utils as registry

    mlflow.set_tracking_uri(None)
    registry._registry_uri = None  # set_registry_uri(None) leaves MLFLOW_REGISTRY_URI set
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI"):
        os.environ.pop(name, None)


@pytest.fixture(autouse=True)
def _reports_match_the_schema(monkeypatch):
    """Every report a test makes in-process (``GateResult.to_dict``) is validated against the schema."""
    from consistency_gate.gate.result import GateResult

    to_dict = GateResult.to_dict
    monkeypatch.setattr(GateResult, "to_dict", lambda self: assert_valid_report(to_dict(self)))


def run_cli(
    *args: str, cwd: Path | None = None, env: dict | None = None, timeout: float = 300, process: bool | None = None
) -> subprocess.CompletedProcess:
    """Run ``consistency-gate`` and return what it printed and its exit code, as a CompletedProcess.

    It runs in this process (``consistency_gate.cli.app.main``, what the console script runs, with
    stdout and stderr captured), which pays the imports once per worker instead of once per call,
    unless the test needs a process of its own: another environment (``env``, unless ``process=False``
    says that what it sets is read when it is used, as a proxy's address and MLflow's retries are, and
    not when a module is imported), or ``process=True`` where what it checks is the process (everything
    a library prints to stderr, a timeout, a kill)."""
    if process or (process is None and env is not None):
        return subprocess.run(
            [sys.executable, "-m", "consistency_gate", *map(str, args)],
            capture_output=True,
            text=True,
            cwd=cwd,
            env=env,
            timeout=timeout,
        )
    return _run_in_process([str(a) for a in args], cwd, env)


def _run_in_process(argv: list[str], cwd: Path | None, env: dict | None = None) -> subprocess.CompletedProcess:
    from click.testing import CliRunner

    from consistency_gate.cli.app import main

    environment, folder = dict(os.environ), os.getcwd()
    with CliRunner().isolation() as (stdout, stderr, _):
        try:
            if cwd is not None:
                os.chdir(cwd)
            if env is not None:
                os.environ.clear()
                os.environ.update(env)
            main(argv)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        finally:  # main sets MLflow's quiet environment: this process's stays as it was
            os.chdir(folder)
            os.environ.clear()
            os.environ.update(environment)
        out, err = stdout.getvalue().decode(), stderr.getvalue().decode()
    return subprocess.CompletedProcess(["consistency-gate", *argv], code, out, err)


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
