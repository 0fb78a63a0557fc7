"""A journey's grammars: the matchers of its engine's tokenizer (made when a grammar is first used),
the mask of what a grammar allows next, and the refusals of a path or a token it does not accept."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

from tokenviz.contract.engine import Capability, Engine, OwnGrammarVocabulary, require
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.grammar import Grammar
from tokenviz.contract.settings import SamplingSettings
from tokenviz.decoding.grammar import GrammarMatchers, hf_vocabulary


class GrammarState:
    def __init__(self, engine: Engine):
        self._engine = engine
        self._matchers: GrammarMatchers | None = None

    @property
    def matchers(self) -> GrammarMatchers:
        if self._matchers is None:
            engine = require(self._engine, Capability.GRAMMAR, "a grammar stage")
            vocab = engine.info.vocab
            if isinstance(engine, OwnGrammarVocabulary):  # its runtime's own: a GGUF in llama.cpp
                vocabulary = cast(Callable[[], Any], engine.grammar_vocabulary)
            else:
                assert engine.tokenizer is not None, "an engine with a grammar stage has its tokenizer here"
                vocabulary = hf_vocabulary(engine.tokenizer, vocab, engine.eos_ids)
            self._matchers = GrammarMatchers(vocabulary, vocab, engine.eos_ids)
        return self._matchers

    def allowed(self, settings: SamplingSettings, generated_ids: Sequence[int]) -> Any:
        """The mask of the tokens `settings`' grammar allows after `generated_ids` (None without one),
        on the engine's device (the stage moves it to the logits' own, where a device map puts them elsewhere)."""
        if settings.grammar is None:
            return None
        return self.matchers.allowed(settings.grammar, generated_ids, self._engine.device)

    def fits(self, grammar: Grammar, generated_ids: Sequence[int]) -> int:
        """How many of `generated_ids` the grammar accepts, from the first."""
        return self.matchers.fits(grammar, generated_ids)

    def complete(self, grammar: Grammar | None, generated_ids: Sequence[int]) -> bool:
        return grammar is not None and self.matchers.complete(grammar, generated_ids)

    def check_new(self, settings: SamplingSettings, before: SamplingSettings, generated_ids: Sequence[int]) -> None:
        """A grammar new in `settings` must be one the engine can follow (GrammarMatchers.check) and
        accept the text generated so far: refused, in one line, where it does not."""
        if settings.grammar is not None and settings.grammar != before.grammar:
            self.matchers.check(settings.grammar)
            self.check_fits(settings, generated_ids, "the text so far")

    def check_fits(self, settings: SamplingSettings, generated_ids: Sequence[int], what: str) -> None:
        """Refuse a path that `settings`' grammar does not accept, naming the token where it leaves it."""
        if settings.grammar is None:
            return
        fits = self.fits(settings.grammar, generated_ids)
        if fits < len(generated_ids):
            token = generated_ids[fits]
            raise TokenvizError(
                f"{what} leaves the grammar ({settings.grammar.label}) at generated token {fits + 1}, "
                f"{self._engine.piece(token)!r}: rewind before it, or reset"
            )

    def check_allows(self, settings: SamplingSettings, generated_ids: Sequence[int], token: int) -> None:
        """Refuse to force a token the grammar does not allow next."""
        allowed = self.allowed(settings, generated_ids)
        if allowed is not None and not bool(allowed[token]):
            assert settings.grammar is not None
            raise TokenvizError(
                f"{self._engine.piece(token)!r} is not allowed here by the grammar ({settings.grammar.label})"
            )
