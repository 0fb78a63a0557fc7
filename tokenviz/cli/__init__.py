"""The command line: `tokenviz [PROMPT]` opens the app, `tokenviz trace` runs headless,
`tokenviz score` scores a text, `tokenviz compare` runs two journeys side by side, `tokenviz serve`
runs the app in a browser, `tokenviz replay` opens a saved journey."""

from tokenviz.cli.commands import run

__all__ = ["run"]
