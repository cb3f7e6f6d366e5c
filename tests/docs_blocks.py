"""The runnable blocks of the README and docs/: ``<!-- runnable -->`` (or ``<!-- runnable: exit N -->``) on the
line before a fenced python or bash block; each page's blocks run in order, in a fresh folder, as a new user
would run them (test_docs.py: the README; test_docs_pages.py: docs/, on the other test worker)."""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUNNABLE = re.compile(r"<!-- runnable(?:: exit (\d+))? -->\n```(\w+)\n(.*?)\n```", re.S)


def runnable_blocks(page: Path) -> list[tuple[str, str, int]]:
    """The page's runnable blocks in order: (language, code, expected exit code)."""
    return [(lang, code, int(code_ or 0)) for code_, lang, code in RUNNABLE.findall(page.read_text())]


def run_blocks(page: Path, folder: Path) -> None:
    """Run the page's blocks in ``folder`` in order; each must exit as its marker says, and a bash block
    print no traceback and no third-party INFO line."""
    # a new user's shell: no MLflow settings left by other tests in this process (MLflow sets some itself)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"  # `consistency-gate` as installed
    for number, (lang, code, expected) in enumerate(runnable_blocks(page), start=1):
        if lang == "python":
            script = folder / f"block{number}.py"
            script.write_text(code)
            command = [sys.executable, str(script)]
        else:
            assert lang == "bash", f"{page.name} block {number}: runnable blocks are python or bash"
            command = ["bash", "-e", "-c", code]
        proc = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=400)
        where = f"{page.name} block {number} ({lang})"
        assert proc.returncode == expected, f"{where}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        if lang == "bash":  # the tool prints its own lines only: no tracebacks, no third-party INFO lines
            assert "Traceback" not in proc.stderr and "INFO" not in proc.stderr, f"{where}:\n{proc.stderr}"
