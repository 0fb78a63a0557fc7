"""A grammar the user gives, read and checked before any model loads: a JSON schema or an EBNF/GBNF/
Lark grammar from a file (a regular file, bounded, UTF-8), or a regular expression as typed; its syntax
checked by the engine that will enforce it (llguidance, which needs no tokenizer for that).

llguidance compiles a grammar's rules recursively in native code, as deep as they refer to each
other: the rules are counted first (at most MAX_GRAMMAR_RULES) and the engine runs on a stack that
holds that many (tokenviz.system.deep_stack), so no grammar can overflow it and end the process.
"""

from __future__ import annotations

import re
from pathlib import Path

import llguidance

from tokenviz.contract.errors import SettingsError
from tokenviz.contract.grammar import GRAMMAR_KINDS, MAX_GRAMMAR_CHARS, Grammar, GrammarKind
from tokenviz.contract.text import shortened
from tokenviz.system.deep_stack import on_deep_stack
from tokenviz.system.reading import parse_json, read_file

ENGINE_FORMATS = {"json-schema": "json_schema", "regex": "regex", "grammar": "grammar"}
MAX_GRAMMAR_BYTES = 4 * MAX_GRAMMAR_CHARS  # UTF-8 takes at most four bytes a character
# Rules of a grammar, or definitions of a JSON schema. The deep stack holds about 80,000 rules that each
# refer to the next (about 3 KB of stack each, measured with llguidance 1.9): a fourth of that is allowed.
MAX_GRAMMAR_RULES = 20_000
_RULE = re.compile(r"^[ \t]*[?!]?[A-Za-z_][\w.-]*[ \t]*(?:\.[0-9]+[ \t]*)?(?::|::=)", re.MULTILINE)
_DEFINITION = re.compile(r'"\$ref"|"\$defs"|"definitions"|"properties"|"items"')
ERROR_CHARS = 200  # of an engine's message: it may quote the whole pattern


def read_grammar(kind: GrammarKind, given: str) -> Grammar:
    """The grammar of `kind` from `given`: the pattern itself for a regex, else a file's path."""
    if kind == "regex":
        grammar = Grammar(kind, given, given)
    else:
        what = f"the {kind} {given}"
        data = read_file(given, MAX_GRAMMAR_BYTES, what)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise SettingsError(f"{what} is not UTF-8 text") from None
        grammar = Grammar(kind, text, Path(given).expanduser().name)
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
        return read_grammar(kind, rest.strip() if kind != "regex" else rest.lstrip(" "))
    return read_grammar("json-schema" if text.lower().endswith(".json") else "grammar", text)


def rule_count(grammar: Grammar) -> int:
    """How many rules the engine will compile, counted from the text: a grammar's rule definitions,
    a JSON schema's references and nested schemas (a regular expression is one rule)."""
    if grammar.kind == "grammar":
        return len(_RULE.findall(grammar.text))
    if grammar.kind == "json-schema":
        return len(_DEFINITION.findall(grammar.text))
    return 1


def engine_grammar(grammar: Grammar) -> str:
    """The grammar in llguidance's own form, its syntax checked: one line when it is wrong."""
    if grammar.kind == "json-schema":
        parse_json(grammar.text, f"the JSON schema {grammar.shown}")
    rules = rule_count(grammar)
    if rules > MAX_GRAMMAR_RULES:
        raise SettingsError(f"the {grammar.kind} {grammar.shown} has {rules:,} rules; at most {MAX_GRAMMAR_RULES:,}")

    def check() -> str:
        try:
            text = llguidance.grammar_from(ENGINE_FORMATS[grammar.kind], grammar.text)  # type: ignore[arg-type]
        except (ValueError, RecursionError) as exc:
            raise SettingsError(f"the {grammar.kind} {grammar.shown} is not valid: {first_line(str(exc))}") from None
        error = llguidance.LLMatcher.validate_grammar(text)
        if error:
            raise SettingsError(f"the {grammar.kind} {grammar.shown} is not valid: {first_line(error)}")
        return text

    return on_deep_stack(check, f"checking the {grammar.kind} {grammar.shown}")


def first_line(message: str) -> str:
    """An engine's message, which may quote the grammar over lines, in one line: its first, and the
    line that names the error where that comes later; at most ERROR_CHARS of each."""
    lines = [line.strip() for line in message.splitlines() if line.strip()] or [message]
    error = next((line for line in lines[1:] if line.startswith("error:")), None)
    first = shortened(lines[0], ERROR_CHARS)
    return first if error is None else f"{first} {shortened(error, ERROR_CHARS)}"
