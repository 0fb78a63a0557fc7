"""A grammar the generated text must follow, as the user gave it: a JSON schema, a regular expression
or an EBNF/GBNF/Lark grammar. Plain data: the engine that enforces it lives in tokenviz.decoding.grammar.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal, cast, get_args

from tokenviz.contract.errors import SettingsError
from tokenviz.contract.text import safe_text, shortened

GrammarKind = Literal["json-schema", "regex", "grammar"]
GRAMMAR_KINDS: tuple[GrammarKind, ...] = get_args(GrammarKind)
MAX_GRAMMAR_CHARS = 256_000  # a JSON schema or grammar longer than this is refused, not held per journey
LABEL_CHARS = 24  # of a source named in the sampling pane's stage
SHOWN_CHARS = 80  # of a source named in a message


@dataclass(frozen=True)
class Grammar:
    kind: GrammarKind
    text: str  # the schema, pattern or grammar, whole
    source: str  # where it came from: a file's name, or the pattern itself

    def __post_init__(self) -> None:
        if self.kind not in GRAMMAR_KINDS:
            raise SettingsError(f"a grammar's kind is one of {', '.join(GRAMMAR_KINDS)}, got {self.kind!r}")
        object.__setattr__(self, "source", safe_text(self.source))  # it is shown; the text never is
        if not isinstance(self.text, str) or not self.text.strip():
            raise SettingsError(f"the {self.kind} {self.shown} is empty")
        if len(self.text) > MAX_GRAMMAR_CHARS:
            raise SettingsError(
                f"the {self.kind} {self.shown} is {len(self.text):,} characters; at most {MAX_GRAMMAR_CHARS:,}"
            )

    @property
    def shown(self) -> str:
        """The source as a message names it: a regex is its own source, and may be long."""
        return shortened(self.source, SHOWN_CHARS)

    @property
    def label(self) -> str:
        """The grammar in a few words: its kind and source, shortened."""
        return f"{self.kind} {shortened(self.source, LABEL_CHARS)}"

    @property
    def digest(self) -> str:
        """Names this grammar in files that list each grammar once (steps refer to it)."""
        return hashlib.sha256(f"{self.kind}\0{self.text}".encode()).hexdigest()[:16]

    @classmethod
    def from_json(cls, d: object) -> Grammar:
        """A grammar as a file lists it ({kind, text, source}); one line where it is not one."""
        fields = ("kind", "text", "source")
        if not isinstance(d, dict) or not all(isinstance(d.get(name), str) for name in fields):
            raise SettingsError(f"a grammar is an object of texts {', '.join(fields)}")
        return cls(kind=cast(GrammarKind, d["kind"]), text=d["text"], source=d["source"])  # its kind: __post_init__'s


def refuse_grammar(grammar: Grammar | None, search: str) -> None:
    """One line for a search that does not follow a grammar, asked for while one is set."""
    if grammar is not None:
        raise SettingsError(f"{search} does not follow a grammar ({grammar.label}): clear it first")
