"""The ``consistency-gate`` command group and its entry points: every error one line and its exit code.

Exit codes: 0 passed or nothing to decide, 1 gate failed, 2 usage error, 3 invalid input
data, 4 model or registry error, 5 tracking server or storage unreachable, refused or
unauthorized, 6 internal error (a bug; never a promotion).
"""

from __future__ import annotations

import atexit
import gc
import logging
import os
import sys
import traceback
from collections.abc import Callable
from typing import NoReturn

import click

from consistency_gate.cli.alias import authorize, rollback
from consistency_gate.cli.check import check, demo, history
from consistency_gate.cli.config import config, plan, report_schema
from consistency_gate.cli.files import compare, diagnose, generations
from consistency_gate.cli.live import shadow
from consistency_gate.cli.watch import watch
from consistency_gate.errors import INTERNAL_ERROR, GateError, one_line, redact_credentials, redact_logs

_verbose = False


def _set_verbose(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    """``--verbose`` before or after the command name: print an error's traceback too."""
    global _verbose
    _verbose = _verbose or value


def _verbose_option() -> click.Option:
    return click.Option(
        ["--verbose"],
        is_flag=True,
        expose_value=False,
        callback=_set_verbose,
        help="Print the traceback of an error too.",
    )


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="consistency-gate")
def cli() -> None:
    """Gate retrained classifiers on their consistency with the previous generation."""


COMMANDS = (compare, generations, check, history, report_schema, config, plan, demo, diagnose, shadow, rollback, watch,
            authorize)  # fmt: skip
for _command in COMMANDS:
    cli.add_command(_command)
for _command in (cli, *cli.commands.values(), *shadow.commands.values()):  # `--verbose check`, `check ... --verbose`
    _command.params.append(_verbose_option())


# third-party noise the tool's own output replaces: MLflow's INFO lines, artifact progress bars, and its
# "View run ... at: URL" lines (the tool prints the run's link itself, credentials redacted; MLflow's
# print the tracking URI as given, password and all)
QUIET_ENVIRONMENT = {
    "MLFLOW_LOGGING_LEVEL": "WARNING",
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",
}


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the CLI and turn GateErrors into one line and their exit code. MLflow's
    INFO lines, progress bars and run links are off unless the environment sets them
    (``QUIET_ENVIRONMENT``); credentials are redacted in every log line."""
    global _verbose
    _verbose = False  # set by this call's --verbose only (main may run more than once in a process)
    for name, value in QUIET_ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    redact_logs()
    # MLflow logs every database error its SQL store meets with the traceback (68 lines for a SQLite file
    # locked for 40 s, though the gate then went on, or said what failed in one line): with --verbose only
    verbose = "--verbose" in (sys.argv[1:] if argv is None else argv)
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.NOTSET if verbose else logging.CRITICAL)
    try:
        code = cli.main(args=argv, standalone_mode=False)
    except GateError as exc:
        _print_traceback()
        click.echo(f"error: {one_line(redact_credentials(str(exc)))}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except Exception as exc:  # noqa: BLE001 - anything else is a bug: say so, with exit 6
        _print_traceback()
        first = one_line(redact_credentials(str(exc)))
        click.echo(
            f"internal error: {type(exc).__name__}: {first[:300]} (a bug in consistency-gate; nothing was promoted; "
            "please report it with the output of `consistency-gate --verbose ...`)",
            err=True,
        )
        sys.exit(INTERNAL_ERROR)
    sys.exit(code if isinstance(code, int) else 0)


def _print_traceback() -> None:
    """With ``--verbose``, the error's traceback on stderr, credentials redacted (a tracking URI's
    password is in MLflow's messages: ``API request to http://user:secret@host ...``)."""
    if _verbose:
        click.echo(redact_credentials(traceback.format_exc()), err=True, nl=False)


def run() -> None:
    """The console script and ``python -m consistency_gate``: :func:`main`, then an exit without the
    interpreter's last full garbage collection (``gc.freeze``), which would walk every object pandas,
    pyarrow and numba made (about 0.1 s of a ``compare``, 5%) for memory the exit gives back anyway.
    Exit handlers (MLflow's among them) still run; :func:`main` alone is for callers that go on.

    An error that ends a command while numba is still compiling a kernel in its thread (a cold cache:
    up to 13 s on 2 cores) does not wait for it: :func:`_exit_without_the_compiler`."""
    try:
        main()
    except SystemExit as exc:
        rows = sys.modules.get("consistency_gate.core.rows")
        if exc.code and rows is not None and rows.still_compiling():
            _exit_without_the_compiler(exc.code if isinstance(exc.code, int) else 1, rows.wait_for_kernels)
        raise
    finally:
        gc.freeze()


def _exit_without_the_compiler(code: int, wait_for_kernels: Callable[[], None]) -> NoReturn:
    """The interpreter's exit less its finalization: the exit handlers run (MLflow's among them), all
    but the one that waits for numba's compiler, then the output is flushed and the process ends (a
    finalization with the compiler's thread in LLVM's C++ would abort it)."""
    atexit.unregister(wait_for_kernels)
    atexit._run_exitfuncs()  # noqa: SLF001 - CPython's exit handlers, as its own exit runs them
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
