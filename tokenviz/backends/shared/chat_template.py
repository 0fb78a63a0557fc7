"""A chat template rendered within bounds. A template is code from the model's files (a GGUF's
`tokenizer.chat_template`, a tokenizer's): Jinja in a sandbox configured as transformers configures its
own (its filters, globals and extensions), bounded here in time (RENDER_S, and Escape), in what it writes
(MAX_RENDERED) and in the value one `*` or `**` may make: unbounded, `'x' * 2000000000` took 4.4 GB before
it failed and nested loops of range(99999) never ended."""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tokenviz.contract.errors import Cancelled, TokenvizError
from tokenviz.contract.text import safe_text
from tokenviz.system.interruptible import Interrupted, interrupt, interruptible

RENDER_S = 3.0  # a template's whole render (the longest templates render in milliseconds)
MAX_RENDERED = 1 << 20  # characters a rendered conversation may hold
MAX_MADE = 1 << 20  # items (or bits of a number) one `*` or `**` may make
SAYS = "the chat template"


def _size(value: Any) -> int:
    """What `value` weighs for the bounds: a number's bits, a sequence's items."""
    if isinstance(value, bool):
        return 1
    if isinstance(value, int):
        return value.bit_length()
    if isinstance(value, str | bytes | list | tuple):
        return len(value)
    return 1


def _made(operator: str, left: Any, right: Any) -> int:
    """About how large `left operator right` would be, before it is computed."""
    if operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1:
        return _size(left) * max(right, 0)
    if operator == "*" and isinstance(right, int) and not isinstance(left, int | float):
        return _size(left) * max(right, 0)
    if operator == "*" and isinstance(left, int) and not isinstance(right, int | float):
        return _size(right) * max(left, 0)
    if operator == "*" and isinstance(left, int) and isinstance(right, int):
        return _size(left) + _size(right)
    return 0


@functools.cache
def _environment() -> Any:
    """The sandbox a template is compiled in: transformers' configuration (read from the environment
    it makes for an empty template), with `*` and `**` bounded (intercepted: never folded at compile)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Bounded(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**"})

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            if _made(operator, left, right) > MAX_MADE:
                raise TokenvizError(f"{SAYS} makes a value of over {MAX_MADE:,} items with {operator}")
            return super().call_binop(context, operator, left, right)

    from transformers.utils.chat_template_utils import _compile_jinja_template

    theirs = _compile_jinja_template("").environment
    ours = Bounded(trim_blocks=True, lstrip_blocks=True, extensions=[type(e) for e in theirs.extensions.values()])
    ours.filters.update(theirs.filters)
    ours.globals.update(theirs.globals)
    return ours


@contextmanager
def bounded(what: str = SAYS) -> Iterator[None]:
    """Inside, the thread is stopped after RENDER_S (one line) or by Escape (Cancelled): a template is
    pure Python, so the interrupt lands within its next instruction."""
    me, late = threading.current_thread(), threading.Event()

    def stop() -> None:
        late.set()
        interrupt(me)

    timer = threading.Timer(RENDER_S, stop)
    timer.daemon = True
    # (started before the section: while a thread is being started, CPython's new thread state carries its
    # starter's id, and an interrupt sent then lands in the new thread; seen in a busy run)
    timer.start()
    try:
        with interruptible():
            if late.is_set():  # the deadline passed before the section began
                raise Interrupted
            yield
    except Interrupted:
        if late.is_set():
            raise TokenvizError(f"{what} did not finish in {RENDER_S:g} s") from None
        raise Cancelled(f"{what} was cancelled") from None
    finally:
        timer.cancel()


def render_chat_template(template: str, messages: list[dict[str, str]], **variables: Any) -> str:
    """`template` rendered for `messages` with the generation prompt, as transformers renders it (with
    `variables`: bos_token, eos_token...), within the bounds; what fails is one line naming the template."""
    environment = _environment()  # importing transformers' part is not the template's time
    try:
        with bounded():
            compiled = environment.from_string(template)
            parts, length = [], 0
            for part in compiled.generate(
                messages=messages, tools=None, documents=None, add_generation_prompt=True, **variables
            ):
                length += len(part)
                if length > MAX_RENDERED:
                    raise TokenvizError(f"{SAYS} writes over {MAX_RENDERED:,} characters")
                parts.append(part)
            return "".join(parts)
    except TokenvizError:
        raise
    except Exception as exc:  # the file's code: any error it raises, RecursionError and MemoryError among them
        why = safe_text(str(exc).splitlines()[0] if str(exc).strip() else type(exc).__name__)
        raise TokenvizError(f"{SAYS} failed: {why[:200]}") from None
