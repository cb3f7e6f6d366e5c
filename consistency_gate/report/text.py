"""Rendering for people, what every command's output shares: numbers formatted, plain-text tables, JSON
without NaN, and text made safe to put in Markdown."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence


def finite_or_null(payload: object, reasons: dict[str, str] | None = None, path: str = "") -> object:
    """A copy of a JSON-able payload with every NaN or infinite number replaced by null.

    JSON has no NaN: ``json.dumps`` would print a bare ``NaN`` that strict parsers refuse. Each
    replaced value's path (list positions as ``[]``) goes into ``reasons`` with why it is null.

    >>> reasons = {}
    >>> finite_or_null({"a": float("nan"), "b": [1.0, float("inf")]}, reasons)
    {'a': None, 'b': [1.0, None]}
    >>> sorted(reasons)
    ['a', 'b[]']
    """
    if isinstance(payload, dict):
        return {k: finite_or_null(v, reasons, f"{path}.{k}" if path else str(k)) for k, v in payload.items()}
    if isinstance(payload, list | tuple):
        return [finite_or_null(v, reasons, f"{path}[]") for v in payload]
    if isinstance(payload, float) and not math.isfinite(payload):
        if reasons is not None:
            reasons.setdefault(path, "undefined (not a finite number; e.g. a zero denominator)")
        return None
    return payload


def fmt(value: object, digits: int = 4) -> str:
    """A metric value for a table: floats rounded, None as 'null'.

    >>> fmt(0.123456), fmt(None), fmt(True), fmt(3)
    ('0.1235', 'null', 'yes', '3')
    """
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def fmt_share(value: float | None) -> str:
    """A probability as a percentage for a table ('' when unknown).

    >>> fmt_share(0.04431), fmt_share(None)
    ('4.4%', '')
    """
    return "" if value is None else f"{100 * value:.1f}%"


def table(rows: Sequence[Sequence[object]], header: Sequence[str]) -> str:
    r"""A left-aligned text table with a rule under the header; a cell's control characters are escaped
    (:func:`printable`), so that a class named ``"a\nb"`` cannot break the table's lines.

    >>> print(table([["con", 0.5], ["a\nb", 1]], ["metric", "value"]))
    metric  value
    ------  ------
    con     0.5000
    a\nb    1
    """
    cells = [[str(h) for h in header]] + [[printable(fmt(c)) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def milliseconds(value: float) -> str:
    """A time in ms to three significant digits, never in exponent form (1.65e+03 ms read badly).

    >>> milliseconds(1654.2), milliseconds(38.04), milliseconds(0.1234)
    ('1,650 ms', '38.0 ms', '0.123 ms')
    """
    if not value:
        return "0 ms"
    places = 2 - math.floor(math.log10(abs(value)))  # decimal places of the third significant digit
    return f"{round(value, places):,.{max(0, places)}f} ms"


_MARKDOWN_SPECIAL = re.compile(r"([\\`\[\]|])")  # escapes, code, links, table cells (not an intraword _)


_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")


def printable(text: str) -> str:
    r"""``text`` with each control character as its Python escape.

    >>> print(printable("cat\ndog\x00"))
    cat\ndog\x00
    """
    return _CONTROL.sub(lambda run: repr(run.group())[1:-1], text)


_TAG_OPEN = re.compile(r"<(?=[A-Za-z/!?])")


_NOT_TEXT = ("links", "run_id")  # URLs and ids: written as links and code, never as text


def markdown_safe(value: object, key: str | None = None) -> object:
    """A report with every text in it fit to be Markdown text: control characters and newlines as a
    space, ``&`` and a ``<`` that would open an HTML tag as entities (no ``<script>`` from a model or
    class name; ``<= 0.02`` stays), and the Markdown characters that could forge a link, code or a
    table cell escaped; links and run ids as they are.

    >>> safe = markdown_safe({"candidate": {"name": "<script>x</script>|[a](b)\\nFAKE"}, "links": {"run": "http://h/"}})
    >>> print(safe["candidate"]["name"], safe["links"]["run"])
    &lt;script>x&lt;/script>\\|\\[a\\](b) FAKE http://h/
    """
    if key in _NOT_TEXT:
        return value
    if isinstance(value, dict):
        return {k: markdown_safe(v, k) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(markdown_safe(v) for v in value)
    if isinstance(value, str):
        text = _TAG_OPEN.sub("&lt;", _CONTROL.sub(" ", value).replace("&", "&amp;"))
        return _MARKDOWN_SPECIAL.sub(r"\\\1", text)
    return value
