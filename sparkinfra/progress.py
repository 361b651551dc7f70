"""
Progress of the long steps at pyinfra's default verbosity.

pyinfra prints a command's output only at ``-vvv`` (with every other command's). A step that can
take minutes (a download, a transfer, an image stream, a lane's start) yields ``shown(command)``
instead: its output lines are printed as they come, prefixed with the host, while the node-side
script keeps them to one line every few seconds. A step that is a no-op yields no command, so
prints nothing.
"""

from __future__ import annotations

from paramiko import SSHException
from pyinfra import host, logger
from pyinfra.api import FunctionCommand, StringCommand
from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS

# The operation's own loop handles these; the others (sudo, timeout, env...) reach the command.
_LOOP_KEYS = ("_retries", "_retry_delay", "_retry_until")


def shown(command: StringCommand | str) -> FunctionCommand:
    """
    ``command`` run as the operation would run it (its sudo, timeout, env), its output printed
    line by line as it comes; on failure the lines are already on screen, and the operation fails.
    Call it inside an operation (it reads the operation's connector arguments there).

    .. code:: python

        yield shown(transfer.pull_command(...))
    """
    arguments = op_arguments()

    def run_shown(state, host):
        return run_printed(state, host, command, arguments)

    run_shown.__name__ = f"shown({command!r})"  # what --dry and --debug name
    wrapper = FunctionCommand(run_shown, (), {})
    wrapper.command = command  # what it runs, for the tests to read
    return wrapper


def op_arguments() -> dict:
    """The current operation's connector arguments (its sudo, timeout, env), for a command a
    ``FunctionCommand`` runs later (``run_printed``). Call it inside an operation."""
    return {
        key: value for key, value in (host.current_op_global_arguments or {}).items()
        if key in CONNECTOR_ARGUMENT_KEYS and key not in _LOOP_KEYS
    }


def run_printed(state, host, command: StringCommand | str, arguments: dict) -> bool:
    """``command`` run on ``host`` with ``arguments`` (``op_arguments``), its lines printed as they
    come. A connection lost meanwhile (the host rebooted, its link dropped) fails the operation with
    one line naming the host and the step in flight, not a traceback."""
    try:
        ok, _ = host.run_shell_command(command, print_output=True, print_input=state.print_input, **arguments)
    except (OSError, EOFError, SSHException) as exc:
        host.log_styled(went_away(state, host, exc), fg="red", log_func=logger.error)
        return False
    return ok


def went_away(state, host, exc: BaseException) -> str:
    """What to say of ``host`` lost while the operation it executes ran a long step."""
    op_hash = getattr(host, "executing_op_hash", None)
    step = "; ".join(sorted(state.get_op_meta(op_hash).names)) if op_hash in getattr(state, "op_meta", {}) else "a step"
    return (f"{host.name} went away while this step ran ({step}): {type(exc).__name__}: {exc or 'connection closed'}. "
            f"What it had done stays; the next converge, once {host.name} answers, does the rest.")
