"""A grammar the user gives, read and checked before any model loads: a JSON schema or an EBNF/GBNF/
Lark grammar from a file (bounded, UTF-8), or a regular expression as typed; its syntax checked by
the engine that will enforce it (llguidance, which needs no tokenizer for that)."""

from __future__ import annotations

import json
from pathlib import Path

import llguidance

from tokenviz.contract.errors import SettingsError
from tokenviz.contract.grammar import GRAMMAR_KINDS, MAX_GRAMMAR_CHARS, Grammar, GrammarKind

ENGINE_FORMATS = {"json-schema": "json_schema", "regex": "regex", "grammar": "grammar"}
MAX_GRAMMAR_BYTES = 4 * MAX_GRAMMAR_CHARS  # (UTF-8 takes at most four bytes a character)


def read_grammar(kind: GrammarKind, given: str) -> Grammar:
    """The grammar of `kind` from `given`: the pattern itself for a regex, else a file's path."""
    if kind == "regex":
        grammar = Grammar(kind, given, given)
    else:
        path = Path(given).expanduser()
        try:
            with path.open("rb") as file:
                data = file.read(MAX_GRAMMAR_BYTES + 1)
        except OSError as exc:
            raise SettingsError(f"cannot read the {kind} {given}: {exc.strerror or exc}") from None
        if len(data) > MAX_GRAMMAR_BYTES:
            raise SettingsError(f"the {kind} {given} is larger than {MAX_GRAMMAR_BYTES:,} bytes")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise SettingsError(f"the {kind} {given} is not UTF-8 text") from None
        grammar = Grammar(kind, text, path.name)
    engine_grammar(grammar)
    return grammar


def grammar_from_line(line: str) -> Grammar | None:
    """A grammar as typed on one line: `json-schema FILE`, `regex PATTERN`, `grammar FILE`, a file
    alone (a .json one is a JSON schema, any other an EBNF grammar), or `none` / `off` (None)."""
    text = line.strip()
    if text.lower() in ("none", "off", "clear", ""):
        return None
    kind, _, rest = text.partition(" ")
    if kind in GRAMMAR_KINDS and rest.strip():
        return read_grammar(kind, rest.strip() if kind != "regex" else rest.lstrip(" "))  # type: ignore[arg-type]
    return read_grammar("json-schema" if text.lower().endswith(".json") else "grammar", text)


def engine_grammar(grammar: Grammar) -> str:
    """The grammar in llguidance's own form, its syntax checked: one line when it is wrong."""
    if grammar.kind == "json-schema":
        try:
            json.loads(grammar.text)
        except json.JSONDecodeError as exc:
            raise SettingsError(f"the JSON schema {grammar.source} is not JSON: {exc}") from None
    try:
        text = llguidance.grammar_from(ENGINE_FORMATS[grammar.kind], grammar.text)  # type: ignore[arg-type]
    except ValueError as exc:
        raise SettingsError(f"the {grammar.kind} {grammar.source} is not valid: {first_line(str(exc))}") from None
    error = llguidance.LLMatcher.validate_grammar(text)
    if error:
        raise SettingsError(f"the {grammar.kind} {grammar.source} is not valid: {first_line(error)}")
    return text


def first_line(message: str) -> str:
    """An engine's message, which may quote the grammar over lines, in one line: its first, and the
    line that names the error where that comes later."""
    lines = [line.strip() for line in message.splitlines() if line.strip()] or [message]
    error = next((line for line in lines[1:] if line.startswith("error:")), None)
    return lines[0] if error is None else f"{lines[0]} {error}"
