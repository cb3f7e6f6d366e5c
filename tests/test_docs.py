"""The README and docs/ as a new user reads them: every code block marked runnable runs as written, in
order, in a fresh folder, with the exit code the text says; links between pages resolve; the README stays
a front door (short, with a glossary)."""

import re

import pytest
from docs_blocks import PAGES, ROOT, RUNNABLE, run_blocks, runnable_blocks


def test_the_marker_finds_blocks_and_their_exit_codes():
    text = "x\n<!-- runnable: exit 1 -->\n```bash\nfalse\n```\n<!-- runnable -->\n```python\nprint(1)\n```\n"
    assert RUNNABLE.findall(text) == [("1", "bash", "false"), ("", "python", "print(1)")]


@pytest.mark.slow
def test_the_readmes_runnable_blocks_run_as_written(tmp_path):
    run_blocks(ROOT / "README.md", tmp_path)


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
