"""The capture a shadow server writes: Parquet parts rolled by rows or time, and a journal that keeps every
answered request through a crash.

Rows wait in memory until a part is written (``roll_rows`` rows, or ``roll_seconds`` after a part's first row),
so each request is also appended to ``.journal.jsonl`` in the folder the moment it is answered (the champion's
answer, provisional until the candidate's comes) and again when it is captured. A writer that was killed
(``kill -9``, a power cut of the process, not of the machine) leaves the journal behind; the next writer on the
folder writes what it holds as a part first, and :func:`~consistency_gate.io.capture.read_capture` reads a
journal left beside the parts, so a shadow check never misses a request that was answered. A folder that cannot
be written (removed, full, read-only) is :attr:`CaptureWriter.failure` until a write succeeds again; the rows
wait in memory meanwhile, and :meth:`CaptureWriter.close` puts what it still cannot write in a file of the
system's temporary folder and says where.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from pathlib import Path

import pandas as pd

from consistency_gate.errors import UsageError, one_line

JOURNAL = ".journal.jsonl"
COLUMNS = ("id", "time", "champion", "candidate", "candidate_error")
UNSCORED = "not scored: the server ended before the candidate answered"  # a journaled request's, until captured


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
    seconds after a part's first row, whichever comes first. A part is written under a name starting with '.'
    and renamed when complete, so a reader of the folder sees only whole parts while the writer goes on.
    Thread-safe; :meth:`close` writes what is left.

    >>> folder = Path(tempfile.mkdtemp())
    >>> writer = CaptureWriter(folder, roll_rows=2)
    >>> t = pd.Timestamp("2026-11-27T10:00:00Z")
    >>> writer.add([{"id": "a", "time": t, "champion": "x", "candidate": "x", "candidate_error": None}] * 3)
    >>> writer.close()
    >>> sorted(p.name for p in folder.iterdir()), len(pd.read_parquet(folder))
    (['part-00000.parquet', 'part-00001.parquet'], 3)
    """

    def __init__(self, folder: str | Path, roll_rows: int = 10_000, roll_seconds: float = 60.0) -> None:
        self.folder = capture_folder(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        taken = [
            int(p.stem.split("-")[1]) for p in self.folder.glob("part-*.parquet") if p.stem.split("-")[1].isdigit()
        ]
        self.next_part = max(taken, default=-1) + 1  # a restarted server adds parts after the old ones
        self.roll_rows, self.roll_seconds = roll_rows, roll_seconds
        self.rows: list[dict] = []
        self.provisional: dict[int, list[dict]] = {}  # answered by the champion, not captured yet: by request
        self.written = 0
        self.failure: str | None = None  # why the folder cannot be written now (None: it can)
        self.fallback: Path | None = None  # where close put the rows the folder would not take
        self.lock = threading.Lock()
        self.first_at: float | None = None
        self.recovered = self._recover()
        self.stopped = threading.Event()
        self.timer = threading.Thread(target=self._roll_on_time, name="capture-roller", daemon=True)
        self.timer.start()

    def answered(self, number: int, rows: list[dict]) -> None:
        """Journal request ``number``'s rows as the champion answered them, before the candidate has: what a
        crash before :meth:`add` leaves in the capture (the candidate's answer missing, and why)."""
        with self.lock:
            self.provisional[number] = rows
            self._journal({"request": number, "final": False, "rows": rows})

    def add(self, rows: list[dict], number: int | None = None) -> None:
        """Append rows (dicts of :data:`COLUMNS`), request ``number``'s final rows where it was journaled as
        answered; a part is written once ``roll_rows`` are buffered."""
        with self.lock:
            self.provisional.pop(number, None)
            self._journal({"request": number, "final": True, "rows": rows})
            if not self.rows:
                self.first_at = time.monotonic()
            self.rows.extend(rows)
            while len(self.rows) >= self.roll_rows and self._write(self.rows[: self.roll_rows]):
                self.rows = self.rows[self.roll_rows :]
                self._rejournal()

    def _roll_on_time(self) -> None:
        while not self.stopped.wait(min(0.5, self.roll_seconds)):
            with self.lock:
                if (
                    self.rows
                    and time.monotonic() - (self.first_at or 0) >= self.roll_seconds
                    and self._write(self.rows)
                ):
                    self.rows = []
                    self._rejournal()

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

    def _journal(self, entry: dict) -> None:
        try:
            with open(self.folder / JOURNAL, "a") as journal:  # closed at once: in the OS's hands, past a kill -9
                journal.write(json.dumps(entry, default=str) + "\n")
        except OSError as exc:
            self.failure = f"cannot append to {self.folder / JOURNAL} ({one_line(str(exc))[:200]})"

    def _rejournal(self) -> None:
        """The journal again, holding only what no part holds yet: the buffered rows and the requests still
        waiting for the candidate."""
        entries = [{"request": n, "final": False, "rows": rows} for n, rows in self.provisional.items()]
        entries += [{"request": None, "final": True, "rows": self.rows}] if self.rows else []
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
        """Stop rolling on time and write what is left: the buffered rows, and the requests the candidate never
        answered as journaled. Rows the folder will not take go to :attr:`fallback`."""
        self.stopped.set()
        self.timer.join()
        with self.lock:
            rows = self.rows + [row for rows in self.provisional.values() for row in rows]
            self.rows, self.provisional = [], {}
            if rows and not self._write(rows):
                self.fallback = Path(tempfile.gettempdir()) / f"consistency-gate-capture-{os.getpid()}.parquet"
                frame = pd.DataFrame(rows, columns=list(COLUMNS)).astype({"id": "string"})
                frame.to_parquet(self.fallback, index=False)
                self.written += len(rows)
                return
            if not self.failure:
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
