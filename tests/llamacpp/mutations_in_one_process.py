"""Run `tokenviz trace` on each hostile GGUF named on the command line (gguf_mutations.MUTATIONS), one
after another in this one process, as a user would from a shell: a line `trying NAME` before each and
`NAME -> CODE | ERROR LINES` after. A mutation that brings the process down is the last one tried."""

import contextlib
import io
import sys
import tempfile
from pathlib import Path

from gguf_mutations import MUTATIONS, write_mutation

from tokenviz.cli import run

PROMPT = "The Eiffel Tower is located in"


def main(names: list[str]) -> None:
    chosen = [m for m in MUTATIONS if m.name in names]
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "mutated.gguf"
        for mutation in chosen:
            print(f"trying {mutation.name}", flush=True)
            write_mutation(mutation, path)
            sys.argv = ["tokenviz", "trace", PROMPT, "--backend", "llama.cpp", "--model", str(path), "--steps", "2"]
            sys.argv += ["--threads", "1", "--temperature", "0"]
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    run()
                    code = 0
                except SystemExit as exc:
                    code = exc.code if isinstance(exc.code, int) else 1
            errors = [line for line in err.getvalue().splitlines() if line.startswith("error:")]
            traceback = "Traceback" in err.getvalue()
            print(f"{mutation.name} -> {code} | {len(errors)} | {traceback} | {' '.join(errors)[:300]}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
