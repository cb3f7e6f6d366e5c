"""The package's shape: no import cycles, no private names across modules, light entry points."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "consistency_gate"
HEAVY = ("torch", "mlflow", "great_expectations", "pyspark", "matplotlib", "sklearn", "numba")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, list[tuple[str, list[str]]]]:
    """Each package module -> the package modules it imports (anywhere in it) and the names it takes."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    found: dict[str, list[tuple[str, list[str]]]] = {}
    for name, path in modules.items():
        edges = []
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("consistency_gate"):
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    target = sub if sub in modules else node.module
                    edges.append((target, [] if target == sub else [alias.name]))
            elif isinstance(node, ast.Import):
                edges += [(a.name, []) for a in node.names if a.name.startswith("consistency_gate")]
        found[name] = edges
    return found


def test_no_import_cycles_between_modules():
    graph = {m: {t for t, _ in edges if t != m and t != "consistency_gate"} for m, edges in _imports().items()}
    state: dict[str, int] = {}  # 1 on the path, 2 done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                cycle = path[path.index(target) :] + [target] if target in path else [module, target]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target, path + [target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


def test_no_private_name_is_imported_across_modules():
    private = [
        f"{m} imports {t}.{n}" for m, edges in _imports().items() for t, names in edges for n in names if n[0] == "_"
    ]
    assert not private, private


def test_report_is_a_leaf():
    """The renderers read reports, not the package; the schema reads the metric names (a list of strings)."""
    for module, edges in _imports().items():
        if module.startswith("consistency_gate.report"):
            allowed = ("consistency_gate.report", "consistency_gate.core.names")
            outside = [t for t, _ in edges if not t.startswith(allowed)]
            assert not outside, f"{module} imports {outside}"


def test_help_and_config_parsing_import_nothing_heavy(tmp_path):
    config = tmp_path / "gate.yaml"
    config.write_text("rules:\n  - {metric: con, min: 0.9}\nremediation:\n  data: train.csv\n  method: dynsnap-step\n")
    probe = (
        "import sys\n"
        "from consistency_gate import cli\n"
        "from consistency_gate.gate.config import load_config\n"
        f"load_config({str(config)!r})\n"
        "try:\n    cli.main(['--help'])\nexcept SystemExit:\n    pass\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_the_console_script_keeps_exit_handlers_and_the_exit_code():
    """``run`` (the console script) leaves out only the interpreter's last garbage collection: exit
    handlers (MLflow flushes its async logging in one) still run, and the exit code is main's."""
    probe = (
        "import atexit, sys\n"
        "from consistency_gate.cli import run\n"
        "atexit.register(print, 'handler ran')\n"
        "sys.argv = ['consistency-gate', 'compare', '--labels', 'missing.csv', '--previous', 'a', '--candidate', 'b']\n"
        "run()\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3 and proc.stdout == "handler ran\n"
    assert proc.stderr.startswith("error: missing.csv: file not found (in ") and proc.stderr.count("\n") == 1
    assert proc.stderr.endswith("check the path, or give the file's absolute path\n")


def test_config_check_validates_without_a_model_or_server(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text("rules:\n  - {metric: ctoi, max: 0.02}\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text("rules:\n  - {metric: ctoi, mx: 0.02}\n")
    ok = subprocess.run(
        [sys.executable, "-m", "consistency_gate", "config", "--check", good], capture_output=True, text=True
    )
    assert ok.returncode == 0 and "valid; 1 rules" in ok.stdout and "ctoi <= 0.02" in ok.stdout
    refused = subprocess.run(
        [sys.executable, "-m", "consistency_gate", "config", "--check", bad], capture_output=True, text=True
    )
    assert refused.returncode == 2 and refused.stderr.startswith(f"error: {bad}")


def test_public_api_at_the_top_level():
    import consistency_gate

    for name in ("run_gate", "compare", "diagnose", "build_ensemble", "ConsistencyCounts"):
        assert callable(getattr(consistency_gate, name)), name


def test_every_counting_state_declares_its_merge():
    from dataclasses import fields

    from consistency_gate.core.counts import ConsistencyCounts

    undeclared = [f.name for f in fields(ConsistencyCounts) if f.name != "ks" and "merge" not in f.metadata]
    assert not undeclared, undeclared


def test_no_module_is_over_600_lines():
    long = {
        str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > 600
    }
    assert not long, long


def test_papers_are_cited_by_the_short_names_of_the_references_page():
    """Docstrings and docs name a paper as docs/references.md does (``Wang et al. 2023``), never by a file
    number of the project's reading list, a section of its specification or the tracker's issue numbers."""
    import re

    root = PACKAGE.parent
    cited = re.compile(r"\b(?:[Ii]ssue|SPEC|[Pp]aper) \d")
    texts = [*PACKAGE.rglob("*.py"), *(root / "docs").glob("*.md"), *(root / "tests").glob("*.py"), root / "README.md"]
    texts += [*(root / "benchmarks").glob("*.py"), root / "benchmarks" / "README.md"]
    found = [f"{p.relative_to(root)}:{i}" for p in texts for i, line in enumerate(p.read_text().splitlines(), 1)
             if cited.search(line) and p.name != "test_architecture.py"]  # fmt: skip
    assert not found, found
    references = (root / "docs" / "references.md").read_text()
    for name in ("Wang et al. 2023", "Jeffares et al. 2023", "HDP", "Traeuble et al. 2021", "Yan et al. 2021"):
        assert f"**{name}**" in references, name
