"""The tracking store: which URI, whether MLflow can keep a registry there, whether it answers,
and what a refusal or an unreachable server means for the user (exit 2 or 5, one line)."""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from consistency_gate.errors import TrackingError, UsageError, redact_credentials

if TYPE_CHECKING:
    from mlflow import MlflowClient

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"


def resolve_tracking_uri(uri: str | None) -> str:
    """The tracking URI: the argument, else ``MLFLOW_TRACKING_URI``, else ``sqlite:///mlflow.db``.

    >>> resolve_tracking_uri("http://mlflow:5000")
    'http://mlflow:5000'
    """
    return uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI


def check_default_store(tracking_uri: str | None) -> None:
    """UsageError when no store is named (no URI, no ``$MLFLOW_TRACKING_URI``) and the default
    ``./mlflow.db`` does not exist: a gate would create an empty store and find no model in it; and
    when an HTTP URI carries a query or a fragment (MLflow appends its API path after it, so every
    request goes to the wrong address: the server answers 405).

    >>> check_default_store("http://mlflow:5000/?token=abc")
    Traceback (most recent call last):
    ...
    consistency_gate.errors.UsageError: tracking URI http://mlflow:5000/?... has a query (?...): ...
    """
    given = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or ""
    if given.startswith(("http://", "https://")) and ("?" in given or "#" in given):
        shown = given.split("?", 1)[0].split("#", 1)[0]
        raise UsageError(
            f"tracking URI {shown}?... has a query (?...): MLflow appends its API path to the URI, so the "
            "query breaks every request; give the server's address alone and a token with "
            "$MLFLOW_TRACKING_TOKEN (or user and password with $MLFLOW_TRACKING_USERNAME / _PASSWORD)"
        )
    if tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or Path("mlflow.db").exists():
        return
    raise UsageError(
        f"no tracking store given and no mlflow.db in {Path.cwd()}: pass --tracking-uri (e.g. "
        "http://mlflow:5000 or sqlite:///path/to/mlflow.db) or set $MLFLOW_TRACKING_URI"
    )


def configure_fail_fast() -> None:
    """Make MLflow's HTTP client give up in seconds, not minutes, when a server is down; no download bars.

    Example::

        configure_fail_fast()  # before the first MLflow request
    """
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "15")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")


# the schemes MLflow 3 keeps runs and registered models under (databases as SQLAlchemy URLs)
DATABASE_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")
SERVER_SCHEMES = ("http", "https", "databricks", "databricks-uc", "uc")
# the pip package that provides a database driver module SQLAlchemy asks for
DRIVER_PACKAGES = {
    "psycopg": "psycopg[binary]",
    "psycopg2": "psycopg2-binary",
    "MySQLdb": "mysqlclient",
    "pymysql": "PyMySQL",
    "pyodbc": "pyodbc",
    "pymssql": "pymssql",
}
SQLITE_HEADER = b"SQLite format 3\x00"


def check_store_uri(uri: str) -> None:
    """Refuse, in one line, a tracking URI MLflow cannot keep a registry in.

    UsageError (exit 2) for a scheme MLflow does not support, or the file store MLflow 3 refuses;
    TrackingError (exit 5) for a SQLite URI on a file that is not a database, or a database whose
    driver is not installed (with the package to install).

    >>> check_store_uri("http://[::1")
    Traceback (most recent call last):
    ...
    consistency_gate.errors.UsageError: tracking URI 'http://[::1' is not a valid URI (Invalid IPv6 URL); e.g. ...
    >>> check_store_uri("ftp://host/mlflow")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    consistency_gate.errors.UsageError: tracking URI 'ftp://host/mlflow': scheme 'ftp' is not one MLflow keeps...
    """
    shown = redact_credentials(uri)
    try:
        parsed = urlparse(uri)
        parsed.port  # noqa: B018 - parses the host and port: raises on 'http://[::1' or a port of letters
    except ValueError as exc:
        raise UsageError(
            f"tracking URI '{shown}' is not a valid URI ({exc}); e.g. http://127.0.0.1:5000 or sqlite:///mlflow.db"
        ) from None
    scheme = parsed.scheme.split("+", 1)[0]
    if scheme in ("", "file") or (len(scheme) == 1 and os.name == "nt"):
        if os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() in ("true", "1"):
            return
        raise UsageError(
            f"tracking URI '{shown}' names a folder (MLflow's file store), which MLflow 3 refuses; use "
            "sqlite:///PATH/mlflow.db or http(s)://HOST:PORT (or migrate it with `mlflow migrate-filestore`)"
        )
    if scheme not in DATABASE_SCHEMES + SERVER_SCHEMES:
        raise UsageError(
            f"tracking URI '{shown}': scheme '{parsed.scheme}' is not one MLflow keeps a model registry in; use "
            "sqlite:///PATH, http(s)://HOST:PORT, or a postgresql://, mysql:// or mssql:// database"
        )
    if scheme == "sqlite":
        path = Path(uri.removeprefix("sqlite:///")).expanduser()
        if path.is_file() and path.stat().st_size:
            with path.open("rb") as f:
                if f.read(len(SQLITE_HEADER)) != SQLITE_HEADER:
                    raise TrackingError(
                        f"tracking store {shown}: {path} is not an SQLite database; point --tracking-uri at "
                        "an MLflow database (or a new file name, which MLflow creates)"
                    )
    elif scheme in DATABASE_SCHEMES:
        from sqlalchemy.engine import make_url

        try:
            make_url(uri).get_dialect().import_dbapi()
        except ModuleNotFoundError as exc:
            package = DRIVER_PACKAGES.get((exc.name or "").split(".")[0], exc.name)
            raise TrackingError(
                f"tracking store {shown}: its database driver '{exc.name}' is not installed; "
                f"`pip install {package}` (or name another driver, e.g. {scheme}+DRIVER://)"
            ) from None
        except Exception as exc:  # noqa: BLE001 - SQLAlchemy's word on a malformed or unknown URL
            raise UsageError(f"tracking URI '{shown}' is not a database URL SQLAlchemy knows: {exc}") from None


def check_reachable(uri: str, timeout: float = 3.0) -> None:
    """Raise within ``timeout`` seconds if the store cannot be used (:func:`check_store_uri`) or
    reached (TrackingError, exit 5).

    An HTTP(S) server is reached through the proxy the environment names for it
    (``HTTPS_PROXY``, ``HTTP_PROXY``, ``NO_PROXY``), as MLflow's client will reach it.

    >>> check_reachable("http://127.0.0.1:1")
    Traceback (most recent call last):
    ...
    consistency_gate.errors.TrackingError: ...
    """
    check_store_uri(uri)
    parsed = urlparse(uri)
    if parsed.scheme in ("http", "https"):
        import requests.utils

        proxy = requests.utils.get_environ_proxies(uri).get(parsed.scheme)
        target = urlparse(proxy) if proxy else parsed
        port = target.port or (443 if target.scheme == "https" else 80)
        via = f" through proxy {redact_credentials(proxy)}" if proxy else ""
        try:
            with socket.create_connection((target.hostname, port), timeout=timeout):
                pass
        except OSError as exc:
            raise TrackingError(
                f"tracking server {redact_credentials(uri)} is unreachable{via} ({exc.strerror or exc}); "
                "start it or fix --tracking-uri"
            ) from None
    elif parsed.scheme == "sqlite":
        folder = Path(uri.removeprefix("sqlite:///")).expanduser().resolve().parent
        if not folder.is_dir():
            raise TrackingError(
                f"tracking store {redact_credentials(uri)}: folder {folder} does not exist; "
                "create it or fix --tracking-uri"
            )


def check_exists(uri: str) -> None:
    """TrackingError (exit 5) for a SQLite store whose file does not exist (a typo in the path: MLflow would
    create an empty store there, which holds no model); nothing for other stores.

    >>> check_exists("sqlite:///no/such/mlflow.db")
    Traceback (most recent call last):
    ...
    consistency_gate.errors.TrackingError: tracking store sqlite:///no/such/mlflow.db: no such file ...
    """
    if urlparse(uri).scheme != "sqlite":
        return
    path = Path(uri.removeprefix("sqlite:///")).expanduser().resolve()
    if not path.is_file():
        raise TrackingError(
            f"tracking store {redact_credentials(uri)}: no such file {path} (MLflow would create an empty store "
            "there, holding no model); fix the path in --tracking-uri"
        )


def refusal(exc: BaseException, uri: str) -> TrackingError | None:
    """A TrackingError (exit 5) if ``exc`` is the server refusing the request (HTTP 401 or 403),
    with the server's reason and what to change; None for any other error.

    >>> refusal(ValueError("disk full"), "sqlite:///mlflow.db") is None
    True
    """
    code = getattr(exc, "error_code", "")
    status = getattr(exc, "get_http_status_code", lambda: None)()
    if code not in ("PERMISSION_DENIED", "UNAUTHENTICATED") and status not in (401, 403):
        return None
    text = str(exc)
    reason = text.split("Response body:", 1)[1].strip(" '\"") if "Response body:" in text else text
    if "host header" in reason.lower():
        host = urlparse(uri).netloc.rsplit("@", 1)[-1]
        advice = f"the server must allow this Host header: start it with --allowed-hosts including '{host}'"
    elif code == "UNAUTHENTICATED" or status == 401:
        advice = "set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN)"
    else:
        advice = "check that this user may read and write the experiment and the registered model"
    return TrackingError(
        f"tracking server {redact_credentials(uri)} refused the request ({status or code}: {reason[:200]}); {advice}"
    )


def check_access(client: MlflowClient, uri: str) -> None:
    """One cheap request to an HTTP(S) tracking server, so that a server that refuses us (a Host
    header it does not allow, missing or wrong credentials) is exit 5 before anything else.

    Example::

        check_access(client, "https://mlflow.example.com")
    """
    if urlparse(uri).scheme not in ("http", "https"):
        return
    try:
        client.search_experiments(max_results=1)
    except Exception as exc:  # noqa: BLE001 - MLflow and requests raise many kinds here
        refused = refusal(exc, uri)
        if refused is not None:
            raise refused from None
        if looks_unreachable(exc):
            raise TrackingError(f"tracking server {redact_credentials(uri)} is unreachable: {exc}") from None
        status = getattr(exc, "get_http_status_code", lambda: None)()
        if status == 404:  # something answers there, but not MLflow's REST API
            path = urlparse(uri).path
            where = f" (the URI has the path '{path}': MLflow's API is under the server's root)" if path else ""
            raise TrackingError(
                f"tracking URI {redact_credentials(uri)} answered 404 Not Found for MLflow's REST API{where}; give the "
                "server's root URL, e.g. http://127.0.0.1:5000"
            ) from None
        raise


def looks_unreachable(exc: BaseException) -> bool:
    """Whether an exception from MLflow or requests means the server or store is gone.

    >>> looks_unreachable(ConnectionError("Connection refused")), looks_unreachable(ValueError("bad"))
    (True, False)
    """
    if isinstance(exc, ConnectionError | TimeoutError):
        return True
    status = getattr(exc, "get_http_status_code", lambda: None)()
    if isinstance(status, int) and status in (502, 503, 504):  # a gateway or a server not ready: away
        return True
    text = f"{type(exc).__name__} {exc}".lower()
    return any(s in text for s in ("connection", "max retries", "timed out", "refused", "unreachable"))


# SQLAlchemy's additions to a database error: the statement, its parameters, and a link to its docs
_SQL_DETAIL = re.compile(
    r"\s*\[(?:SQL|parameters): .*?\](?=\s*(?:\[|\(Background|$))" r"|\s*\(Background on this error at: [^)]*\)", re.S
)


def store_failure(exc: BaseException) -> str:
    """A store's error in words a gate prints: a database error without the SQL statement SQLAlchemy adds
    (a page of it), and for a locked SQLite file what to do.

    >>> store_failure(Exception("(sqlite3.OperationalError) database is locked [SQL: SELECT 1] [parameters: (1,)]"))
    '(sqlite3.OperationalError) database is locked; another process is writing to the SQLite file (a gate, or ...'
    """
    text = _SQL_DETAIL.sub("", str(exc)).strip()
    if "database is locked" in text:
        text += (
            "; another process is writing to the SQLite file (a gate, or an MLflow server on it): try again when "
            "it is done, or serve the store with `mlflow server` for gates that run at once"
        )
    return text


def mlflow_tracking_uri() -> str:
    """The tracking URI MLflow's client uses now.

    Example::

        mlflow_tracking_uri()
        # 'sqlite:///mlflow.db'
    """
    import mlflow

    return mlflow.get_tracking_uri()


def connect(tracking_uri: str | None, existing: bool = False) -> tuple[str, MlflowClient]:
    """Check the tracking store (supported, reachable, not refusing us), point MLflow's fluent API
    at it for tracking and the registry (``models:/`` URIs load through both; never a stray
    ``./mlflow.db``), and return its URI and a client. ``existing``: the command reads what the store
    already holds (registered models, gate runs), so a SQLite file that does not exist is a wrong path,
    refused before MLflow would create an empty store there.

    Example::

        uri, client = connect("sqlite:///mlflow.db", existing=True)
    """
    import mlflow
    from mlflow import MlflowClient

    check_default_store(tracking_uri)
    uri = resolve_tracking_uri(tracking_uri)
    configure_fail_fast()
    check_reachable(uri)
    if existing:
        check_exists(uri)
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    try:
        client = MlflowClient(tracking_uri=uri, registry_uri=uri)  # opens a SQL store's database (and migrates it)
    except Exception as exc:  # noqa: BLE001 - SQLAlchemy's errors, whose classes are not imported here
        if type(exc).__name__ != "OperationalError":
            raise
        raise TrackingError(f"tracking store {redact_credentials(uri)}: {store_failure(exc)}") from None
    check_access(client, uri)
    return uri, client
