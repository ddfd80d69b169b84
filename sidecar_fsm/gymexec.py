"""``sidecar-fsm exec``: run a command with NeMo Gym's sidecar launcher resolved to sidecar-fsm's.

Owns the command's environment (``_gymboot`` first on ``PYTHONPATH``; its ``sitecustomize`` does
the redirecting) and the ``execvpe`` that replaces this process, as ``ddtrace-run`` does: the
command gets this pid, so its exit status, signals and job control reach it with no middleman.
Must not start the sidecars, touch state or import the launcher. Python run with ``-I``/``-E``/``-S``
ignores ``PYTHONPATH`` or ``sitecustomize`` and is not redirected.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NoReturn

BOOTSTRAP_DIR = str(Path(__file__).resolve().parent / "_gymboot")

# NeMo Gym's module -> ours. The bootstrap keeps its own copy (it cannot import this module
# without importing sidecar_fsm in every Python process); a test keeps the two equal.
REDIRECTED_MODULES = {
    "nemo_gym.h2_ping_sidecar.launcher": "sidecar_fsm.launcher",
    "nemo_gym.h2_ping_sidecar.config": "sidecar_fsm.config",
}

# As a POSIX shell reports them: not found, found but not runnable.
EXIT_NOT_FOUND = 127
EXIT_CANNOT_RUN = 126

# Python ignores these for itself (a broken pipe is an exception, not death); an ignored
# disposition survives exec, so the command would inherit it. subprocess restores the same.
_RESTORED_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGPIPE", "SIGXFZ", "SIGXFSZ") if hasattr(signal, name)
)


class ExecFailed(Exception):
    """The command could not be started; ``exit_code`` is the shell's (127 or 126)."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def command_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` with the bootstrap folder first on ``PYTHONPATH``; the rest kept verbatim. Pure."""
    env = dict(environ)
    previous = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = BOOTSTRAP_DIR + (os.pathsep + previous if previous else "")
    return env


def exec_command(command: Sequence[str], where: str = "sidecar-fsm exec") -> NoReturn:
    """Replace this process with ``command`` (searched on PATH), its Python redirected. Raises
    ``ExecFailed`` when it cannot be executed, signal dispositions back as they were."""
    if not command:
        raise ValueError("exec_command: empty command")
    env = command_environ(os.environ)
    sys.stdout.flush()
    sys.stderr.flush()
    previous = {sig: signal.signal(sig, signal.SIG_DFL) for sig in _RESTORED_SIGNALS}
    try:
        os.execvpe(command[0], list(command), env)
    except OSError as error:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        raise _failure(command[0], error, env.get("PATH"), where) from None


def _failure(name: str, error: OSError, path: str | None, where: str) -> ExecFailed:
    found = name if os.sep in name else shutil.which(name, path=path)
    if isinstance(error, FileNotFoundError):
        if found is None or not os.path.exists(found):
            return ExecFailed(
                f"{where}: '{name}': command not found; check the name and PATH", EXIT_NOT_FOUND
            )
        # The file exists, so what is missing is the interpreter its #! line names.
        return ExecFailed(
            f"{where}: '{name}': cannot run {found}: its #! interpreter is not found; fix its first line",
            EXIT_NOT_FOUND,
        )
    if isinstance(error, PermissionError):
        return ExecFailed(
            f"{where}: '{name}': permission denied; make it executable (chmod +x) or check the path",
            EXIT_CANNOT_RUN,
        )
    return ExecFailed(f"{where}: '{name}': cannot run it ({error.strerror})", EXIT_CANNOT_RUN)
