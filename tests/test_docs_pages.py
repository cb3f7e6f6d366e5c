"""docs/ as a new user reads it: every runnable block of each page runs as written, in order, in a fresh
folder (apart from test_docs.py, so the pages and the README run on both test workers)."""

import pytest
from docs_blocks import PAGES, run_blocks, runnable_blocks


@pytest.mark.slow
@pytest.mark.parametrize("page", [p for p in PAGES[1:] if runnable_blocks(p)], ids=lambda p: p.name)
def test_runnable_blocks_run_as_written(page, tmp_path):
    run_blocks(page, tmp_path)
