"""`tokenviz serve`: the app in a browser."""

import sys
from typing import Annotated, Optional

import typer

from tokenviz.cli.backend_options import BackendChoice, journey_options
from tokenviz.cli.commands.common import Theme, check_chat, new_cli
from tokenviz.cli.options import (
    Chat,
    System,
    err,
    fail,
    print_error,
)
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.settings import SamplingSettings
from tokenviz.ui.themes import DEFAULT_THEME, check_theme

SERVE_OPTIONS = ("--host", "--port", "--max-sessions")  # serve's own: every other argument goes to the app


LOOPBACK = ("127.0.0.1", "localhost", "::1")


def app_arguments(args: list[str]) -> list[str]:
    """`args` without serve's own options and their values: what each browser tab's app is given."""
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg in SERVE_OPTIONS:
            skip = True
        elif not arg.startswith(tuple(f"{option}=" for option in SERVE_OPTIONS)):
            out.append(arg)
    return out


serve_cli = new_cli()


@serve_cli.command()
@journey_options("serve")
def serve(
    settings: SamplingSettings,
    backend: BackendChoice,
    prompt: Annotated[Optional[str], typer.Argument(help="Text to start from (as for tokenviz).")] = None,
    host: Annotated[
        str, typer.Option(help="Address to listen on. Anyone who can reach it can drive the model: keep it local.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    max_sessions: Annotated[
        int,
        typer.Option(
            "--max-sessions",
            help="The most browser tabs served at once, each a process with its own model "
            "(0: as many as the memory available holds).",
        ),
    ] = 0,
    chat: Chat = False,
    system: System = None,
    theme: Theme = DEFAULT_THEME,
) -> None:
    """The same app in a web browser (textual-serve): each tab gets its own journey, and closing the
    tab ends its process. Takes every option tokenviz takes (--endpoint too: each tab a client of the
    model's server)."""
    import shlex
    import socket

    try:
        check_theme(theme)
        check_chat(chat, system)
        if not 0 < port < 65536:
            raise TokenvizError(f"--port must be 1-65535, got {port}")
        if max_sessions < 0:
            raise TokenvizError(f"--max-sessions must be 1 or more (0: from the memory available), got {max_sessions}")
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.bind((host, port))
    except TokenvizError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
    try:  # checked once here, as each tab will: an unreachable server is told now
        chosen = backend.backend()
        backend.loader(settings)
    except TokenvizError as exc:
        fail(str(exc))
    from tokenviz.cli.serving import LimitedServer, session_limit

    command = shlex.join([sys.executable, "-m", "tokenviz", *app_arguments(sys.argv[2:])])
    if host not in LOOPBACK:
        print_error(f"listening on {host}: anyone who can reach port {port} can drive the model")
    limit, why = session_limit(max_sessions, backend.model, weights_here=chosen.weights_here)
    plural = "" if limit == 1 else "s"
    err.print(
        f"tokenviz in a browser: http://{host}:{port} · at most {limit} session{plural} at once ({why}) "
        "(ctrl+c stops it)",
        highlight=False,
    )
    LimitedServer(command, limit, host=host, port=port, title="tokenviz").serve()
