"""Captures of live traffic and the labels that arrive later, read into one table: per served request its id,
its time, the champion's answer and the candidate's, and, once known, its label and when it arrived.

Three captures are read:

- a table (CSV or Parquet, a file or a folder of them: what ``consistency-gate shadow serve`` writes) with
  the columns ``id``, ``time``, ``champion`` and ``candidate`` (hard labels; the candidate's is empty where
  it failed on the request);
- SageMaker Data Capture JSON Lines, one file or folder per variant (the production variant's and the
  shadow variant's), joined by ``inferenceId`` where the caller set one, else by ``eventId``; an output of
  scores is read as the class of the highest score, in the order of ``classes``.

Labels: CSV or Parquet, a file or a folder, with ``id``, ``label`` and optionally ``time`` (when the label
arrived; without it every label counts as arrived with its request).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from consistency_gate.errors import DataError, UsageError
from consistency_gate.io.capture_writer import journal_rows
from consistency_gate.io.predictions import file_format

CAPTURE_COLUMNS = ("id", "time", "champion", "candidate")
LABEL_COLUMNS = ("id", "label")


def _parts(path: Path, suffixes: tuple[str, ...]) -> list[Path]:
    """A file, or the files of a folder with one of ``suffixes`` in name order; a name starting with '.'
    or '_' (a part still being written, Spark's ``_SUCCESS``) is not read."""
    if not path.exists():
        raise DataError(f"{path}: file or folder not found")
    if path.is_file():
        return [path]
    parts = sorted(p for p in path.rglob("*") if p.suffix.lower() in suffixes and not p.name.startswith((".", "_")))
    if not parts:
        raise DataError(f"{path}: a folder without {' or '.join(suffixes)} files")
    return parts


def read_table(path: str | Path, needed: Sequence[str]) -> pd.DataFrame:
    """A CSV or Parquet file, or a folder of them, with the ``needed`` columns (DataError, exit 3, naming the
    file, what is missing and what it has). Ids and answers are read as text.

    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> pd.DataFrame({"id": [1, 2], "label": ["cat", "dog"]}).to_csv(folder / "labels.csv", index=False)
    >>> read_table(folder / "labels.csv", LABEL_COLUMNS)["id"].tolist()
    ['1', '2']
    """
    frames = []
    for part in _parts(Path(path), (".csv", ".parquet", ".pq")):
        try:
            if file_format(part) == "parquet":
                frame = pd.read_parquet(part)
            else:
                frame = pd.read_csv(part, dtype=str, keep_default_na=False, na_values=[""])
        except (OSError, ValueError, pd.errors.ParserError) as exc:
            raise DataError(
                f"{part}: not a readable {file_format(part).upper()} file (truncated, or still being written?); "
                f"the reader said: {str(exc)[:200]}; give complete files (a capture folder's finished parts)"
            ) from None
        missing = [c for c in needed if c not in frame.columns]
        if missing:
            raise DataError(
                f"{part}: no column {', '.join(repr(c) for c in missing)} (it has "
                f"{', '.join(map(str, frame.columns[:12]))}); expected {', '.join(needed)}"
            )
        frames.append(frame)
    frame = pd.concat(frames, ignore_index=True)
    for column in ("id", "label", "champion", "candidate"):
        if column in frame.columns:
            frame[column] = frame[column].astype("string")
    return frame


def _times(values: pd.Series, where: str) -> pd.Series:
    """Times as UTC timestamps: ISO text, datetimes, or numbers of seconds since 1970."""
    try:
        if pd.api.types.is_datetime64_any_dtype(values):
            return pd.to_datetime(values, utc=True)
        if pd.api.types.is_numeric_dtype(values):
            return pd.to_datetime(values, unit="s", utc=True)
        numeric = pd.to_numeric(values, errors="coerce")
        if numeric.notna().all() and len(values):
            return pd.to_datetime(numeric, unit="s", utc=True)
        return pd.to_datetime(values, utc=True, format="ISO8601")
    except (ValueError, TypeError) as exc:
        raise DataError(
            f"{where}: a time that is not a date and time ({str(exc)[:120]}); write ISO 8601 or seconds since 1970"
        ) from None


def _identified(frame: pd.DataFrame, where: str) -> None:
    if frame["id"].isna().any():
        row = int(frame["id"].isna().to_numpy().argmax())
        raise DataError(f"{where}: row {row + 1} has no id; every request (and label) needs one")


def _unique(frame: pd.DataFrame, where: str) -> None:
    _identified(frame, where)
    repeated = frame["id"].duplicated()
    if repeated.any():
        raise DataError(
            f"{where}: id '{frame['id'][repeated].iloc[0]}' appears more than once; each request has one id "
            "(give each row its own, or drop the repeats)"
        )


def read_capture(path: str | Path) -> pd.DataFrame:
    """A capture table: ``id``, ``time`` (UTC), ``champion`` and ``candidate`` (text, missing where the candidate
    failed), in the order of time; a folder's journal (the requests a killed ``shadow serve`` answered and did not
    write as a part) is read too. An id may come back (a client's retry with the same ``X-Request-Id``): the
    shadow check keeps its first request and counts the repeats. DataError (exit 3) for a capture of no request.

    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> served = {"id": ["a", "b"], "time": [1.0, 2.0], "champion": ["cat", "dog"], "candidate": ["cat", None]}
    >>> pd.DataFrame(served).to_parquet(folder / "part-0.parquet")
    >>> read_capture(folder)[["id", "candidate"]].values.tolist()
    [['a', 'cat'], ['b', <NA>]]
    """
    path = Path(path)
    left = journal_rows(path) if path.is_dir() else []  # read first: a part written meanwhile repeats, never loses
    try:
        frame = read_table(path, CAPTURE_COLUMNS)
    except DataError:
        if not left:
            raise
        frame = pd.DataFrame(columns=list(CAPTURE_COLUMNS))
    if left:  # what a killed server answered and did not write as a part
        frame["time"] = _times(frame["time"], str(path))
        journaled = pd.DataFrame(left)[list(CAPTURE_COLUMNS)].astype(
            {c: "string" for c in ("id", "champion", "candidate")}
        )
        frame = pd.concat([frame[list(CAPTURE_COLUMNS)], journaled], ignore_index=True).drop_duplicates()
    if frame.empty:
        raise DataError(
            f"{path}: the capture holds no request (0 rows); shadow serve writes its answers there once it has served "
            "requests: run the check when it has"
        )
    frame["time"] = _times(frame["time"], str(path))
    _identified(frame, str(path))
    if frame["champion"].isna().any():
        row = frame[frame["champion"].isna()].iloc[0]
        raise DataError(f"{path}: request '{row['id']}' has no champion answer; the champion answers every request")
    return frame[list(CAPTURE_COLUMNS)].sort_values("time", kind="stable").reset_index(drop=True)


def read_labels(path: str | Path) -> pd.DataFrame:
    """Labels: ``id``, ``label`` and ``time`` (UTC; missing where the file has no time column).

    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> pd.DataFrame({"id": ["a"], "label": ["cat"]}).to_csv(folder / "labels.csv", index=False)
    >>> read_labels(folder / "labels.csv").columns.tolist()
    ['id', 'label', 'time']
    """
    frame = read_table(path, LABEL_COLUMNS)
    frame["time"] = _times(frame["time"], str(path)) if "time" in frame.columns else pd.NaT
    _unique(frame, str(path))
    if frame["label"].isna().any():
        raise DataError(f"{path}: the label of id '{frame['id'][frame['label'].isna()].iloc[0]}' is empty")
    return frame[["id", "label", "time"]]


def read_sagemaker(champion: str | Path, candidate: str | Path, classes: Sequence[str] | None) -> pd.DataFrame:
    """SageMaker Data Capture JSON Lines of the production variant (``champion``) and the shadow variant
    (``candidate``), each a file or a folder, as a capture table. A request with several rows gives one
    sample per row (``ID#1``, ``ID#2``...); scores need ``classes``.

    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> def record(out):
    ...     data = {"endpointOutput": {"data": out, "encoding": "CSV", "mode": "OUTPUT"}}
    ...     meta = {"eventId": "e1", "inferenceTime": "2026-11-27T10:00:00Z"}
    ...     return json.dumps({"captureData": data, "eventMetadata": meta, "eventVersion": "0"})
    >>> _ = (folder / "prod.jsonl").write_text(record("0.9,0.1") + "\\n")
    >>> _ = (folder / "shadow.jsonl").write_text(record("0.2,0.8") + "\\n")
    >>> read = read_sagemaker(folder / "prod.jsonl", folder / "shadow.jsonl", ["cat", "dog"])
    >>> read[["champion", "candidate"]].values.tolist()
    [['cat', 'dog']]
    """
    served = _variant(Path(champion), classes).rename(columns={"answer": "champion"})
    shadow = _variant(Path(candidate), classes).rename(columns={"answer": "candidate"})
    joined = served.merge(shadow[["id", "candidate"]], on="id", how="left")
    if joined["candidate"].isna().all() and len(joined):
        raise DataError(
            f"{candidate}: no request of {champion} is in it (first ids '{served['id'].iloc[0]}' and "
            f"'{shadow['id'].iloc[0] if len(shadow) else ''}'); give the shadow variant's capture of the same endpoint"
        )
    joined["candidate"] = joined["candidate"].astype("string")
    return joined[list(CAPTURE_COLUMNS)].sort_values("time", kind="stable").reset_index(drop=True)


def _variant(path: Path, classes: Sequence[str] | None) -> pd.DataFrame:
    """One variant's captured answers: id, time, answer."""
    rows = []
    for part in _parts(path, (".jsonl", ".json")):
        with open(part, encoding="utf-8") as fh:
            for number, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                where = f"{part}, line {number}"
                try:
                    record = json.loads(line)
                    meta = record["eventMetadata"]
                    output = record["captureData"]["endpointOutput"]
                except (json.JSONDecodeError, KeyError, TypeError):
                    raise DataError(
                        f"{where}: not a SageMaker Data Capture record (JSON with captureData.endpointOutput "
                        "and eventMetadata); give the variant's capture files as SageMaker wrote them"
                    ) from None
                key = str(meta.get("inferenceId") or meta.get("eventId") or "")
                if not key:
                    raise DataError(f"{where}: a record without eventId or inferenceId to join the variants by")
                answers = _answers(output, classes, where)
                for i, answer in enumerate(answers):
                    rows.append((key if len(answers) == 1 else f"{key}#{i}", meta.get("inferenceTime"), answer))
    frame = pd.DataFrame(rows, columns=["id", "time", "answer"], dtype=object)
    frame["time"] = _times(frame["time"], str(path))
    frame["id"] = frame["id"].astype("string")
    frame["answer"] = frame["answer"].astype("string")
    _unique(frame, str(path))
    return frame


def _answers(output: dict, classes: Sequence[str] | None, where: str) -> list[str]:
    """The answers of one captured output: CSV or JSON (``{"predictions": ...}`` as MLflow's scoring server
    answers, or a bare list), base64 where SageMaker encoded it; rows of scores become the class of the
    highest score."""
    data = output.get("data", "")
    if output.get("encoding", "").upper() == "BASE64":
        data = base64.b64decode(data).decode("utf-8")
    if output.get("encoding", "").upper() == "JSON" or data.lstrip().startswith(("{", "[")):
        parsed = json.loads(data)
        values = parsed.get("predictions", parsed) if isinstance(parsed, dict) else parsed
        rows = [v if isinstance(v, list) else [v] for v in values]
    else:
        rows = [line.split(",") for line in data.strip().splitlines()]
    answers = []
    for row in rows:
        if len(row) == 1:
            answers.append(str(row[0]).strip())
            continue
        if classes is None or len(classes) != len(row):
            raise UsageError(
                f"{where}: an output of {len(row)} scores needs the class names in their order "
                f"(--classes a,b,... with {len(row)} names, or the model version's consistency_gate.classes tag)"
            )
        scores = [float(v) for v in row]
        answers.append(str(classes[scores.index(max(scores))]))
    return answers
