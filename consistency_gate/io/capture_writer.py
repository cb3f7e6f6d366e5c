"""The capture a shadow server writes: Parquet parts rolled by rows or time, and a journal that keeps the answered
requests through a crash.

Rows wait in memory until a part is written (``roll_rows`` rows, or ``roll_seconds`` after a part's first row).
Each request is also written to ``.journal.jsonl`` in the folder (the champion's answer, provisional until the
candidate's comes, and again when it is captured) by **group commit**: the request path only appends the entry to
a list in memory; the writer's own thread writes what the list holds in one append every ``group_s`` seconds
(20 ms by default) while requests come, and waits to be woken by the next request once a group is empty, so the
champion's answer never waits for a disk write and the requests of a group cost one wake-up of the thread, not
one each. A writer that was killed (``kill -9``, a crash of the process, not of the machine) leaves the
journal behind, short of at most the last group (the requests answered since the last append); the next writer
on the folder writes what the journal holds as a part first, and
:func:`~consistency_gate.io.capture.read_capture` reads a journal left beside the parts. A stop
(:meth:`CaptureWriter.close`) loses nothing. A folder that cannot be written (removed, full, read-only) is
:attr:`CaptureWriter.failure` until a write succeeds again; the rows wait in memory meanwhile, and
:meth:`CaptureWriter.close` puts what it still cannot write in a file of the system's temporary folder and says
where.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import TextIO

import pandas as pd

from consistency_gate.errors import UsageError, one_line

JOURNAL = ".journal.jsonl"
COLUMNS = ("id", "time", "champion", "candidate", "candidate_error")
UNSCORED = "not scored: the server ended before the candidate answered"  # a journaled request's, until captured
GROUP_S = 0.02  # the journal's group commit: the requests answered within this many seconds in one write


def capture_folder(folder: str | Path) -> Path:
    """``folder`` as a capture's folder (made if it is not there); a UsageError (exit 2) naming it when it, or a
    folder above it, is a file.

    >>> import tempfile; taken = Path(tempfile.mkdtemp()) / "answers.csv"; _ = taken.write_text("id")
    >>> capture_folder(taken / "parts")
    Traceback (most recent call last):
    ...
    consistency_gate.errors.UsageError: --capture .../answers.csv/parts: .../answers.csv is a file, not a folder; ...
    """
    folder = Path(folder)
    for place in (folder, *folder.parents):
        if place.exists() and not place.is_dir():
            raise UsageError(
                f"--capture {folder}: {place} is a file, not a folder; give a folder for the capture's Parquet parts "
                "(made if it is not there)"
            )
    return folder


class CaptureWriter:
    """Appends captured rows to a folder of Parquet parts, rolled every ``roll_rows`` rows or ``roll_seconds``
    seconds after a part's first row, whichever comes first, with the journal written by group commit every
    ``group_s`` seconds (``journal=False``: none, a crash loses the rows not in a part). A part is written under a
    name starting with '.' and renamed when complete, so a reader of the folder sees only whole parts while the
    writer goes on. Thread-safe: :meth:`answered` and :meth:`add` only append in memory, under a lock held for no
    I/O; the files are written by the writer's thread, and by :meth:`close`, which writes what is left.

    >>> folder = Path(tempfile.mkdtemp())
    >>> writer = CaptureWriter(folder, roll_rows=2)
    >>> t = pd.Timestamp("2026-11-27T10:00:00Z")
    >>> writer.add([{"id": "a", "time": t, "champion": "x", "candidate": "x", "candidate_error": None}] * 3)
    >>> writer.close()
    >>> sorted(p.name for p in folder.iterdir()), len(pd.read_parquet(folder))
    (['part-00000.parquet', 'part-00001.parquet'], 3)
    """

    def __init__(
        self, folder: str | Path, roll_rows: int = 10_000, roll_seconds: float = 60.0, group_s: float = GROUP_S,
        journal: bool = True,
    ) -> None:  # fmt: skip
        self.folder = capture_folder(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        taken = [
            int(p.stem.split("-")[1]) for p in self.folder.glob("part-*.parquet") if p.stem.split("-")[1].isdigit()
        ]
        self.next_part = max(taken, default=-1) + 1  # a restarted server adds parts after the old ones
        self.roll_rows, self.roll_seconds, self.group_s, self.journal = roll_rows, roll_seconds, group_s, journal
        self.rows: list[dict] = []
        self.provisional: dict[int, list[dict]] = {}  # answered by the champion, not captured yet: by request
        self.group: list[dict] = []  # journal entries not written yet: the next group
        self.idle = True  # the writer's thread waits for an entry to wake it (else it wakes every group_s)
        self.requests = 0  # requests answered (numbered 1, 2, ... in the order they were journaled)
        self.groups = 0  # groups appended to the journal
        self.written = 0
        self.failure: str | None = None  # why the folder cannot be written now (None: it can)
        self.fallback: Path | None = None  # where close put the rows the folder would not take
        self.state = threading.Lock()  # rows, provisional, group, requests: never held for I/O
        self._open: TextIO | None = None  # the journal, kept open by the writer's thread
        self.first_at: float | None = None
        self.recovered = self._recover()
        self.stopped, self.wake = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._run, name="capture-writer", daemon=True)
        self.thread.start()

    def answered(self, rows: list[dict]) -> int:
        """Note a request's rows as the champion answered them, before the candidate has (what a crash before
        :meth:`add` leaves in the capture: the candidate's answer missing, and why); returns the request's
        number, for :meth:`add`."""
        with self.state:
            self.requests += 1
            self.provisional[self.requests] = rows
            if self.journal:
                self.group.append({"request": self.requests, "final": False, "rows": rows})
            number = self.requests
            wake = self._due_a_group()
        if wake:
            self.wake.set()
        return number

    def add(self, rows: list[dict], number: int | None = None) -> None:
        """Append rows (dicts of :data:`COLUMNS`), request ``number``'s final rows where it was noted as
        answered; a part is written once ``roll_rows`` are buffered."""
        with self.state:
            self.provisional.pop(number, None)
            if self.journal:
                self.group.append({"request": number, "final": True, "rows": rows})
            if not self.rows:
                self.first_at = time.monotonic()
            self.rows.extend(rows)
            # without a journal, a part due wakes the thread; else its next look (0.5 s) writes one
            wake = self._due_a_group() if self.journal else len(self.rows) >= self.roll_rows
        if wake:
            self.wake.set()

    def _due_a_group(self) -> bool:
        """Whether the writer's thread waits to be woken for a group (under :attr:`state`): only the first entry
        after a pause wakes it; while requests come it wakes by itself every ``group_s``. A wake-up costs 50-90 us
        of CPU on a 2-core VM, and the champion's threads a turn at the GIL: with 5 ms groups, about one a request
        at 250 requests/s, the server spent 9% more CPU per request than the champion served alone."""
        wake, self.idle = self.idle, False
        return wake

    def _run(self) -> None:
        """The writer's thread: once woken, a group appended to the journal every ``group_s`` until one is empty
        (then it waits to be woken again), and a part written when one is due."""
        while not self.stopped.is_set():
            if self.wake.wait(min(0.5, self.roll_seconds)):
                self.wake.clear()
                # the requests answered meanwhile join the group
                while not self.stopped.wait(self.group_s) and self._commit():
                    self._roll()
            self._roll()

    def _commit(self) -> bool:
        """Append the group waiting in memory to the journal, in one write; False when there was none (the thread
        is then idle: the next entry wakes it)."""
        with self.state:
            group, self.group = self.group, []
            self.idle = not group
        if not group:
            return False
        text = "".join(json.dumps(entry, default=str) + "\n" for entry in group)
        try:
            journal = self._journal_file()
            journal.write(text)
            journal.flush()  # in the OS's hands: past a kill -9
        except OSError as exc:
            self.failure = f"cannot append to {self.folder / JOURNAL} ({one_line(str(exc))[:200]})"
            return True
        self.groups += 1
        return True

    def _journal_file(self) -> TextIO:
        """The journal, open for appending; opened again when the file open is no longer in the folder (the
        folder removed, or made again; one ``fstat``, no path looked up)."""
        try:
            same = self._open is not None and os.fstat(self._open.fileno()).st_nlink > 0
        except OSError:
            same = False
        if not same:
            self._close_journal()
            # kept open between groups, closed by _close_journal
            self._open = open(self.folder / JOURNAL, "a")  # noqa: SIM115
        return self._open

    def _close_journal(self) -> None:
        if self._open is not None:
            with contextlib.suppress(OSError):
                self._open.close()
            self._open = None

    def _roll(self, done: bool = False) -> None:
        """Write the parts that are due (``done``: every buffered row), then the journal again, holding only what
        no part holds yet: the buffered rows and the requests still waiting for the candidate."""
        while True:
            with self.state:
                due = len(self.rows) >= self.roll_rows or (
                    self.rows and (done or time.monotonic() - (self.first_at or 0) >= self.roll_seconds)
                )
                rows = self.rows[: self.roll_rows] if due else []
            if not rows or not self._write(rows):
                return
            with self.state:
                self.rows = self.rows[len(rows) :]
                self.first_at = time.monotonic()
                left = [{"request": n, "final": False, "rows": r} for n, r in self.provisional.items()]
                left += [{"request": None, "final": True, "rows": self.rows}] if self.rows else []
                self.group = []  # all of it is in what is left
            if self.journal:
                self._rejournal(left)

    def _write(self, rows: list[dict]) -> bool:
        """Write ``rows`` as the next part; False (and :attr:`failure` says why) when the folder will not take it."""
        frame = pd.DataFrame(rows, columns=list(COLUMNS))
        for column in ("id", "champion", "candidate", "candidate_error"):
            frame[column] = frame[column].astype("string")
        name = f"part-{self.next_part:05d}.parquet"
        partial = self.folder / f".{name}.tmp"
        try:
            self.folder.mkdir(parents=True, exist_ok=True)  # a folder removed meanwhile is made again
            frame.to_parquet(partial, index=False)
            os.replace(partial, self.folder / name)
        except OSError as exc:
            self.failure = f"cannot write {len(rows)} captured rows to {self.folder} ({one_line(str(exc))[:200]})"
            return False
        self.failure = None
        self.next_part += 1
        self.written += len(rows)
        return True

    def _rejournal(self, entries: list[dict]) -> None:
        """The journal replaced by ``entries``."""
        self._close_journal()
        try:
            partial = self.folder / f"{JOURNAL}.tmp"
            partial.write_text("".join(json.dumps(e, default=str) + "\n" for e in entries))
            os.replace(partial, self.folder / JOURNAL)
        except OSError as exc:
            self.failure = f"cannot rewrite {self.folder / JOURNAL} ({one_line(str(exc))[:200]})"

    def _recover(self) -> int:
        """Write the rows a killed writer left in the folder's journal as a part; returns how many."""
        rows = journal_rows(self.folder)
        if rows and self._write(rows):
            (self.folder / JOURNAL).unlink()
            return len(rows)
        return 0

    def close(self) -> None:
        """Stop the writer's thread and write what is left: the buffered rows, and the requests the candidate never
        answered as noted. Rows the folder will not take go to :attr:`fallback`."""
        self.stopped.set()
        self.wake.set()
        self.thread.join()
        self._commit()
        with self.state:
            self.rows += [row for rows in self.provisional.values() for row in rows]
            self.provisional = {}
        self._roll(done=True)
        self._close_journal()
        if self.rows:
            self.fallback = Path(tempfile.gettempdir()) / f"consistency-gate-capture-{os.getpid()}.parquet"
            frame = pd.DataFrame(self.rows, columns=list(COLUMNS)).astype({"id": "string"})
            frame.to_parquet(self.fallback, index=False)
            self.written += len(self.rows)
            self.rows = []
        elif not self.failure:
            (self.folder / JOURNAL).unlink(missing_ok=True)


def journal_rows(folder: Path) -> list[dict]:
    """The rows a journal in ``folder`` holds: each request's final rows, or its provisional ones where the
    candidate had not answered (none for a folder without a journal; a line cut short by a kill is skipped).

    >>> folder = Path(tempfile.mkdtemp())
    >>> row = {"id": "a", "time": "2026-11-27 10:00:00+00:00", "champion": "x", "candidate": None}
    >>> lines = [{"request": 1, "final": False, "rows": [row]}, {"request": 2, "final": False, "rows": [row]},
    ...          {"request": 1, "final": True, "rows": [{**row, "candidate": "y"}]}]
    >>> _ = (folder / JOURNAL).write_text("".join(json.dumps(line) + "\\n" for line in lines) + '{"requ')
    >>> [(r["candidate"], r["candidate_error"]) for r in journal_rows(folder)]
    [('y', None), (None, 'not scored: the server ended before the candidate answered')]
    """
    path = folder / JOURNAL
    if not path.exists():
        return []
    final: list[dict] = []
    captured: set = set()
    provisional: dict = {}
    for line in path.read_text().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry["final"]:
            final += [{**row, "candidate_error": row.get("candidate_error")} for row in entry["rows"]]
            captured.add(entry["request"])
        else:
            provisional[entry["request"]] = entry["rows"]
    pending = [
        {**row, "candidate": None, "candidate_error": UNSCORED}
        for number, rows in provisional.items()
        if number not in captured
        for row in rows
    ]
    return [{**row, "time": pd.Timestamp(row["time"])} for row in final + pending]
