"""Pipelines, Docker files and the Markdown summary: the CI recipes run here end to end."""

import contextlib
import importlib.util
import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PRECOMPILE = "from consistency_gate.core.kernels import precompile; precompile()"


def _bash(script: str, env: dict, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **env, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return subprocess.run(["bash", "-c", script], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=600)


def test_compose_file_names_the_documented_services_and_volumes():
    compose = yaml.safe_load((ROOT / "docker/compose.yaml").read_text())
    assert set(compose["services"]) == {"postgres", "mlflow", "gate", "watch"}
    assert set(compose["volumes"]) == {"pgdata", "mlartifacts"}
    command = compose["services"]["mlflow"]["command"]
    assert "postgresql://" in command and "--artifacts-destination /mlartifacts" in command
    assert "mlartifacts:/mlartifacts" in compose["services"]["mlflow"]["volumes"]
    assert compose["services"]["gate"]["environment"]["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
    page = (ROOT / "docs/ci.md").read_text()
    section = page.split("## Running with Docker Compose")[1].split("\n## ")[0]
    for name in ("postgres", "mlflow", "gate", "pgdata", "mlartifacts"):
        assert f"`{name}`" in section


def test_dockerfile_installs_as_ci_does():
    dockerfile = (ROOT / "Dockerfile").read_text()
    ci = (ROOT / ".ci/run").read_text()
    assert "python -m pip install -q torch==2.13.0 && python -m pip install -q" in dockerfile
    assert "python -m pip install -q torch==2.13.0 && python -m pip install -q" in ci
    assert 'ENTRYPOINT ["consistency-gate"]' in dockerfile
    # dependencies (torch first) are installed before the source is copied: a code change keeps their layer
    assert dockerfile.index("pip install -q torch==2.13.0") < dockerfile.index("COPY consistency_gate")
    assert PRECOMPILE in dockerfile and "NUMBA_CACHE_DIR=/opt/numba-cache" in dockerfile


def test_kernels_precompile_into_the_cache_dir(tmp_path):
    """What the image build runs (``precompile()``): the kernels land in NUMBA_CACHE_DIR for later
    processes, an index per kernel. Two short kernels here (2 s; all of them take 40 s on 2 cores cold),
    through the same function and cache."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    code = "from consistency_gate.core.kernels import precompile; precompile(names={'cosine_rows', 'pearson_rows'})"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    indexes = sorted(path.name.split("-")[0] for path in tmp_path.rglob("*.nbi"))
    assert indexes == ["kernels.cosine_rows", "kernels.pearson_rows"]


def _steps(workflow: dict) -> dict[str, str]:
    job = workflow["jobs"]["retrain-and-gate"]
    return {step["name"]: step["run"] for step in job["steps"] if "run" in step and "name" in step}


def _champion(workdir: Path) -> str | None:
    """The version holding @champion in the pipeline's SQLite store (None: not set)."""
    import mlflow
    from mlflow import MlflowClient

    uri = f"sqlite:///{workdir / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)  # not the registry another test set
    try:
        return str(client.get_model_version_by_alias("digits-classifier", "champion").version)
    except mlflow.exceptions.MlflowException:
        return None


@pytest.mark.slow
def test_github_workflow_commands_gate_and_block(tmp_path):
    steps = _steps(yaml.safe_load((ROOT / "pipelines/github/consistency-gate.yml").read_text()))
    summary = tmp_path / "summary.md"
    outputs = tmp_path / "github-output"
    work = tmp_path / "work"
    env = {"GATE_WORKDIR": str(work), "GITHUB_STEP_SUMMARY": str(summary), "GITHUB_OUTPUT": str(outputs)}
    env["MLFLOW_TRACKING_URI"] = ""  # what ${{ secrets.MLFLOW_TRACKING_URI }} gives when the secret is unset
    train = _bash(steps["Retrain and register a new generation"], env)
    assert train.returncode == 0, train.stderr
    assert _champion(work) is None  # training never sets the alias: only the gate promotes
    gate = _bash(steps["Consistency gate"], env, cwd=tmp_path)  # v1: a first generation, its own rules
    assert gate.returncode == 0, gate.stdout + gate.stderr
    assert "consistency gate passed: version 1" in gate.stdout and _champion(work) == "1"
    train = _bash(steps["Retrain and register a new generation"], env)
    assert train.returncode == 0, train.stderr
    (work / "eval.csv").rename(work / "eval.kept")  # v2 against v1 without its evaluation data: exit 3
    bad = _bash(steps["Consistency gate"], env, cwd=tmp_path)
    assert bad.returncode == 3 and "invalid evaluation data" in bad.stdout and _champion(work) == "1"
    (work / "eval.kept").rename(work / "eval.csv")
    gate = _bash(steps["Consistency gate"], env, cwd=tmp_path)  # v2 against v1
    assert gate.returncode == 0, gate.stdout + gate.stderr
    assert "consistency gate passed: version 2" in gate.stdout and _champion(work) == "2"
    assert "PASSED" in summary.read_text() and (tmp_path / "gate-report.json").exists()
    assert outputs.read_text().splitlines()[-1] == "version=2"  # the deploy job's input
    again = _bash(steps["Consistency gate"], env, cwd=tmp_path)  # v2 is @champion: nothing to decide
    assert again.returncode == 0 and "nothing to decide" in summary.read_text()
    assert outputs.read_text().splitlines()[-1] == "version="  # nothing new passed: the deploy job is skipped


@pytest.mark.slow
def test_gitlab_job_commands(tmp_path):
    ci = yaml.safe_load((ROOT / "pipelines/gitlab/.gitlab-ci.yml").read_text())
    env = {"GATE_WORKDIR": str(tmp_path / "work"), "MLFLOW_TRACKING_URI": ""}  # the CI/CD variable unset
    # one generation (the GitHub test gates a second against it, with the same `check` options)
    for line in ci["retrain"]["script"]:
        assert _bash(line, env).returncode == 0
    gate = _bash("\n".join(ci["consistency-gate"]["script"]), env, cwd=tmp_path)
    assert gate.returncode == 0, gate.stdout + gate.stderr
    assert _champion(tmp_path / "work") == "1"  # the first generation passed its own rules
    assert "| rule | value | outcome |" in (tmp_path / "gate-summary.md").read_text()
    assert (tmp_path / "gate.env").read_text() == "GATE_VERSION=1\n"
    deploy = _bash("\n".join(ci["deploy"]["script"]), {"GATE_VERSION": "1"})
    assert deploy.stdout.strip() == "deploy models:/digits-classifier/1 here"
    skipped = _bash("\n".join(ci["deploy"]["script"]), {"GATE_VERSION": ""})
    assert skipped.stdout.strip() == "no new version passed the gate: nothing to deploy"


def test_pipeline_recipes_lint_and_say_what_ci_needs():
    github = ROOT / "pipelines/github/consistency-gate.yml"
    gitlab = yaml.safe_load((ROOT / "pipelines/gitlab/.gitlab-ci.yml").read_text())
    workflow = yaml.safe_load(github.read_text())
    assert workflow["jobs"]["retrain-and-gate"]["outputs"]["version"] == "${{ steps.gate.outputs.version }}"
    assert workflow["jobs"]["deploy"]["needs"] == "retrain-and-gate"
    assert gitlab["consistency-gate"]["artifacts"]["reports"]["dotenv"] == "gate.env"
    for text in (github.read_text(), (ROOT / "pipelines/gitlab/.gitlab-ci.yml").read_text()):
        assert "torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in text  # the CPU build
        assert "must be shared" in text  # a SQLite file on a fresh runner only ever sees a first generation
    actionlint = shutil.which("actionlint")
    if actionlint is None:
        pytest.skip("actionlint is not installed (the dev extra installs it on Linux x86-64)")
    proc = subprocess.run([actionlint, str(github)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _pipeline_step(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    """``retrain_and_gate.py all`` with no MLFLOW_TRACKING_URI, its ``main`` run in this process (the
    GitHub and GitLab tests run the recipes' steps as processes): what it printed and its exit code."""
    spec = importlib.util.spec_from_file_location("retrain_and_gate", ROOT / "pipelines/retrain_and_gate.py")
    step = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(step)
    argv = ["all", "--workdir", str(workdir), *args]
    stdout, stderr = io.StringIO(), io.StringIO()
    uri = os.environ.pop("MLFLOW_TRACKING_URI", None)
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            code = step.main(argv)
    finally:
        if uri is not None:
            os.environ["MLFLOW_TRACKING_URI"] = uri
    return subprocess.CompletedProcess(argv, code, stdout.getvalue(), stderr.getvalue())


@pytest.mark.slow
def test_python_pipeline_step_runs_end_to_end(tmp_path):
    proc = _pipeline_step(tmp_path, "--report", str(tmp_path / "r.json"))
    assert proc.returncode == 0, proc.stderr
    assert "registered digits-classifier v1" in proc.stdout and (tmp_path / "r.json").exists()
    assert _champion(tmp_path) is None  # passed, but promoted only when asked


@pytest.mark.slow
def test_a_first_generation_that_fails_its_rules_is_never_champion(tmp_path):
    """The pipelines used to make the first generation @champion when it was trained, before any gate ran."""
    strict = tmp_path / "strict.yaml"
    strict.write_text("rules:\n  - {metric: acc, min: 0.999}\n")
    proc = _pipeline_step(tmp_path / "work", "--promote", "--config", str(strict))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAILED" in proc.stdout and _champion(tmp_path / "work") is None
    proc = _pipeline_step(tmp_path / "work", "--promote", "--seed", "2")  # v2: still a first generation, passes
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _champion(tmp_path / "work") == "2"
