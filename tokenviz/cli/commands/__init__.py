"""The commands: `tokenviz [PROMPT]` opens the app; `tokenviz trace PROMPT` runs the journey headless;
`tokenviz score TEXT` scores a text; `tokenviz compare PROMPT` runs two journeys side by side;
`tokenviz serve` runs the app in a browser; `tokenviz replay FILE` opens a saved journey; `tokenviz sae-train`
trains a small sparse autoencoder on the model's residual; `tokenviz sae-index DIR` finds its features'
top-activating contexts over a text.

Every foreseeable mistake ends with one line on stderr and exit code 2, never a traceback.
"""

import sys
from typing import NoReturn

import typer

from tokenviz.backends.registry import refusals
from tokenviz.cli.backend_options import left_out
from tokenviz.cli.commands.app import app_cli
from tokenviz.cli.commands.common import USAGE_ERROR
from tokenviz.cli.commands.compare import compare_cli
from tokenviz.cli.commands.replay import replay_cli
from tokenviz.cli.commands.sae_index import sae_index_cli
from tokenviz.cli.commands.sae_train import sae_train_cli
from tokenviz.cli.commands.score import score_cli
from tokenviz.cli.commands.serve import serve_cli
from tokenviz.cli.commands.trace import trace_cli
from tokenviz.cli.options import print_error, print_warning
from tokenviz.system.cpu_threads import tidy_thread_setting

SUBCOMMANDS = {
    "trace": trace_cli,
    "replay": replay_cli,
    "score": score_cli,
    "compare": compare_cli,
    "serve": serve_cli,
    "sae-train": sae_train_cli,
    "sae-index": sae_index_cli,
}


def run() -> None:
    """Entry point: `tokenviz trace|replay|score|compare|serve ...` go to their own commands, everything
    else to the app."""
    tidy_thread_setting(print_warning)
    for line in (*refusals(), *left_out()):  # plugins left out as the command line was built: said once
        print_warning(line)
    args = sys.argv[1:]
    if args and args[0] in SUBCOMMANDS:
        command(SUBCOMMANDS[args[0]], args[1:], f"tokenviz {args[0]}")
    else:
        command(app_cli, args, "tokenviz")


def command(cli: typer.Typer, args: list[str], name: str) -> NoReturn:
    """Run `cli` on `args`; a mistyped option or argument is one line (click's usage box was three,
    and a box), with the way to the options."""
    try:
        code = cli(args=args, prog_name=name, standalone_mode=False)
    except Exception as exc:  # click's exceptions: vendored inside typer by its newer releases
        if type(exc).__name__ == "Abort":  # ctrl+c before the command's own handling began
            print_error("aborted")
            raise SystemExit(1) from None
        message = getattr(exc, "format_message", None)
        if message is None or getattr(exc, "exit_code", None) != USAGE_ERROR:
            raise
        print_error(f"{message()} (see {name} --help)")
        raise SystemExit(USAGE_ERROR) from None
    raise SystemExit(code if isinstance(code, int) else 0)
