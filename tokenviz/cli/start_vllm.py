"""`python -m tokenviz.cli.start_vllm`: a vLLM server on the bundled model, for trying a served model.

It builds the server's environment when missing (the one the tests use: tokenviz.backends.served.vllm_server),
converts the bundled model once, starts vLLM on a free port of 127.0.0.1 with a fresh token and the
vllm-lens plugin (the lens and attention rows of the served model), waits until it answers, and prints
the two lines to paste in a second terminal. Ctrl-C stops it, and so do SIGTERM and SIGHUP.
"""

from __future__ import annotations

import argparse
import secrets
import shlex
import signal
import subprocess
import sys
from pathlib import Path

from tokenviz.backends.served import vllm_server as vllm
from tokenviz.backends.transformers.gguf_cache import ensure_converted, gguf_cache_dir
from tokenviz.contract.errors import TokenvizError
from tokenviz.system.paths import bundled_gguf, cache_root

KEY_VARIABLE = "TOKENVIZ_KEY"
TRY_PROMPT = "The Eiffel Tower is located in"


def paste_lines(port: int, key: str, model: Path | None = None) -> list[str]:
    """The lines to paste; with `model` (the served directory), tokenviz reads its head there: the lens."""
    url = f"http://127.0.0.1:{port}/v1"
    files = f" --tokenizer {shlex.quote(str(model))}" if model else ""
    return [
        f"export {KEY_VARIABLE}={key}",
        f'tokenviz "{TRY_PROMPT}" --endpoint {url} --api-key-env {KEY_VARIABLE}{files}',
    ]


def _stopping(signum: int, frame: object) -> None:
    """SIGTERM or SIGHUP (a closed terminal): stop as Ctrl-C does, the server with this process. (The
    server runs in a session of its own, so no signal to this one's reaches it.)"""
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tokenviz.cli.start_vllm", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0, help="the port on 127.0.0.1 (default: a free one)")
    args = parser.parse_args(argv)
    for ending in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(ending, _stopping)
    process: subprocess.Popen[bytes] | None = None
    try:
        python = vllm.ensure_environment(say=lambda step: print(f"building the server's environment: {step}"))
        gguf = bundled_gguf()
        model = gguf_cache_dir(gguf)
        ensure_converted(gguf, model, lambda message, fraction: None)
        port, key = args.port or vllm.free_port(), secrets.token_hex(16)
        log = cache_root() / "vllm-server.log"
        print(f"starting vLLM on 127.0.0.1:{port} (under a minute once warm; its log: {log})", flush=True)
        process = vllm.start(python, model, port, key, log, lens=True)  # the key goes to no one else
        vllm.wait_ready(process, f"http://127.0.0.1:{port}/v1", key, log)
        print("ready. In a second terminal, with tokenviz's environment active, paste:\n")
        print("\n".join(f"    {line}" for line in paste_lines(port, key, model)))
        print("\nCtrl-C here stops the server.", flush=True)
        process.wait()
        print(f"error: the vLLM server exited ({process.returncode}); its log: {log}", file=sys.stderr)
        return 1
    except TokenvizError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2 if process is None else 1
    except KeyboardInterrupt:
        return 0
    finally:
        if process is not None:
            vllm.stop(process)


if __name__ == "__main__":
    sys.exit(main())
