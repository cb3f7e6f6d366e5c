"""The README and docs/ as a new user reads them: every code block marked runnable runs as written, in
order, in a fresh folder, with the exit code the text says; links between pages resolve; the README stays
a front door (short, with a glossary)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# <!-- runnable --> or <!-- runnable: exit 1 --> on the line before a fenced block
RUNNABLE = re.compile(r"<!-- runnable(?:: exit (\d+))? -->\n```(\w+)\n(.*?)\n```", re.S)


def runnable_blocks(page: Path) -> list[tuple[str, str, int]]:
    """The page's runnable blocks in order: (language, code, expected exit code)."""
    return [(lang, code, int(code_ or 0)) for code_, lang, code in RUNNABLE.findall(page.read_text())]


def test_the_marker_finds_blocks_and_their_exit_codes():
    text = "x\n<!-- runnable: exit 1 -->\n```bash\nfalse\n```\n<!-- runnable -->\n```python\nprint(1)\n```\n"
    assert RUNNABLE.findall(text) == [("1", "bash", "false"), ("", "python", "print(1)")]


@pytest.mark.slow
@pytest.mark.parametrize("page", [p for p in PAGES if runnable_blocks(p)], ids=lambda p: p.name)
def test_runnable_blocks_run_as_written(page, tmp_path):
    # a new user's shell: no MLflow settings left by other tests in this process (MLflow sets some itself)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"  # `consistency-gate` as installed
    for number, (lang, code, expected) in enumerate(runnable_blocks(page), start=1):
        if lang == "python":
            script = tmp_path / f"block{number}.py"
            script.write_text(code)
            command = [sys.executable, str(script)]
        else:
            assert lang == "bash", f"{page.name} block {number}: runnable blocks are python or bash"
            command = ["bash", "-e", "-c", code]
        proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
        where = f"{page.name} block {number} ({lang})"
        assert proc.returncode == expected, f"{where}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        if lang == "bash":  # the tool prints its own lines only: no tracebacks, no third-party INFO lines
            assert "Traceback" not in proc.stderr and "INFO" not in proc.stderr, f"{where}:\n{proc.stderr}"


def test_readme_is_a_front_door():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.encode()) <= 15_000
    lines = readme.splitlines()
    assert lines[0] == "# consistency-gate" and "```bash" in lines[:20]  # what it is, then the two commands
    for term in ("CON", "ACC-CON", "CtoI", "Com", "DynSnap", "kappa", "beta\\*", "HQ", "GX", "SPEC", "@champion"):
        assert term in readme.split("## Glossary")[1], term
    assert runnable_blocks(ROOT / "README.md"), "the README's own-model snippet is run by the tests"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_links_between_pages_resolve(page):
    for target in re.findall(r"\]\(([^)#\s]+)\)", page.read_text()):
        if not target.startswith(("http://", "https://")):
            assert (page.parent / target).exists(), f"{page.name} links to {target}, which does not exist"
