"""The grammar stage: which next tokens keep the generated text inside a grammar, as llguidance says.

One matcher per grammar follows the journey's generated tokens: a step consumes one, a rewind or a
branch rolls back to the tokens both paths share, so the allowed set at any context costs only what
changed. The mask is computed on the host (a bit per token) and goes to the logits' device once.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import llguidance
import llguidance.hf
import torch
from transformers import LogitsProcessor

from tokenviz.contract.engine import shared_prefix
from tokenviz.contract.errors import SettingsError, TokenvizError
from tokenviz.contract.grammar import Grammar
from tokenviz.files.grammar_file import engine_grammar, first_line
from tokenviz.system.deep_stack import on_deep_stack
from tokenviz.tensors.transfer import to_device

CHECKED_STEPS = 4  # tokens a grammar is followed ahead of the model, to meet the engine's limits early
KEPT_MATCHERS = 4  # grammars followed at once: the session's, a comparison's, the last few it switched from


class GrammarMask(LogitsProcessor):
    """Forbids every token the grammar does not allow next (its score becomes -inf), as the engines'
    logits processors for generate() do."""

    def __init__(self, allowed: torch.Tensor):
        self.allowed = allowed

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        return scores.masked_fill(~self.allowed.to(scores.device), float("-inf"))  # type: ignore[return-value]


def unpack(bitmask: torch.Tensor, vocab: int, device: torch.device) -> torch.Tensor:
    """(vocab,) bool from llguidance's int32 words, a bit per token, unpacked on `device`."""
    words = to_device(bitmask.reshape(-1), device)
    bits = torch.arange(32, dtype=torch.int32, device=device)  # made there: no copy
    return ((words.unsqueeze(-1) >> bits) & 1).bool().reshape(-1)[:vocab]


@dataclass
class Followed:
    """One grammar's matcher and the generated tokens it has consumed."""

    matcher: llguidance.LLMatcher
    shown: str = "grammar"  # how a failure names it ("the lark chain.lark")
    consumed: list[int] = field(default_factory=list)

    def follow(self, ids: Sequence[int]) -> int:
        """Bring the matcher to `ids`, as far as the grammar allows them: how many it took."""
        shared = shared_prefix(self.consumed, ids)
        if shared < len(self.consumed):
            self.matcher.rollback(len(self.consumed) - shared)
            del self.consumed[shared:]
        rest = list(ids[shared:])
        fits = self.matcher.validate_tokens(rest) if rest else 0
        if fits:
            self.matcher.consume_tokens(rest[:fits])
            self.consumed.extend(rest[:fits])
        if self.matcher.is_error():  # not expected: only validated tokens are consumed
            raise TokenvizError(f"{self.shown}: the grammar engine failed: {first_line(self.matcher.get_error())}")
        return shared + fits


def hf_vocabulary(tokenizer: Any, vocab: int, eos_ids: Collection[int]) -> Callable[[], llguidance.LLTokenizer]:
    """A Hugging Face tokenizer's vocabulary as the grammar engine reads it (made when first asked)."""
    return lambda: llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab, eos_token=sorted(eos_ids) or None)


class GrammarMatchers:
    """The matchers of one model's vocabulary, one per grammar in use. `vocabulary()` makes the vocabulary
    as llguidance reads it: from a Hugging Face tokenizer (hf_vocabulary), or from the runtime that runs
    the model (llama.cpp's own, for a GGUF there)."""

    def __init__(self, vocabulary: Callable[[], llguidance.LLTokenizer], vocab: int, eos_ids: Collection[int]):
        self._vocabulary = vocabulary
        self.vocab = vocab
        self._eos_ids = sorted(eos_ids)
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._followed: dict[Grammar, Followed] = {}

    def _engine_tokenizer(self) -> llguidance.LLTokenizer:
        """Made once (about half a second for a 49,152-token vocabulary)."""
        if self._tokenizer is None:
            try:
                self._tokenizer = self._vocabulary()
            except (ValueError, TypeError) as exc:
                raise TokenvizError(f"this model's tokenizer cannot follow a grammar: {first_line(str(exc))}") from None
        return self._tokenizer

    def _matcher(self, grammar: Grammar) -> Followed:
        followed = self._followed.pop(grammar, None)
        if followed is None:
            tokenizer, text = self._engine_tokenizer(), engine_grammar(grammar)
            matcher = on_deep_stack(  # compiled as engine_grammar checked it: recursively, see there
                lambda: llguidance.LLMatcher(tokenizer, text, log_level=0), f"the {grammar.kind} {grammar.shown}"
            )
            if matcher.is_error():
                error = first_line(matcher.get_error())
                raise SettingsError(f"the {grammar.kind} {grammar.shown} is not valid: {error}")
            followed = Followed(matcher, f"the {grammar.kind} {grammar.shown}")
        self._followed[grammar] = followed  # the newest last; the oldest goes past KEPT_MATCHERS
        while len(self._followed) > KEPT_MATCHERS:
            del self._followed[next(iter(self._followed))]
        return followed

    def check(self, grammar: Grammar) -> None:
        """Refuse, in one line, a grammar that admits no text at all (not even an empty one), or that
        this tokenizer's engine cannot follow: its limits are met in its first steps (22,000 alternatives
        fill a parser row after one token), so the check follows the first token allowed, CHECKED_STEPS
        times, and rolls the matcher back."""
        followed = self._matcher(grammar)
        followed.follow(())
        matcher, taken = followed.matcher, 0
        try:
            for step in range(CHECKED_STEPS):
                mask = self._mask(matcher, torch.device("cpu"))
                self._refuse_failure(grammar, matcher, admits_nothing=step == 0)  # before the mask is read
                allowed = mask.nonzero().flatten().tolist()
                if step == 0 and not allowed:
                    raise SettingsError(f"the {grammar.kind} {grammar.shown} admits no text at all")
                token = next((t for t in allowed if t not in self._eos_ids), None)
                if token is None:
                    break
                matcher.consume_token(token)
                taken += 1
                self._refuse_failure(grammar, matcher)
        except SettingsError:
            del self._followed[grammar]
            raise
        matcher.rollback(taken)

    @staticmethod
    def _refuse_failure(grammar: Grammar, matcher: llguidance.LLMatcher, admits_nothing: bool = False) -> None:
        if not matcher.is_error():
            return
        error = first_line(matcher.get_error())
        if admits_nothing and error.startswith("NoExtensionBias"):  # the engine's word for an empty first mask
            raise SettingsError(f"the {grammar.kind} {grammar.shown} admits no text at all")
        raise SettingsError(f"the {grammar.kind} {grammar.shown} cannot be followed: {error}")

    def fits(self, grammar: Grammar, ids: Sequence[int]) -> int:
        """How many of the generated `ids` the grammar accepts, from the first."""
        return self._matcher(grammar).follow(ids)

    def complete(self, grammar: Grammar, ids: Sequence[int]) -> bool:
        """Whether, after `ids`, the grammar allows nothing more (only an end of sequence)."""
        followed = self._matcher(grammar)
        return followed.follow(ids) == len(ids) and followed.matcher.is_stopped()

    def allowed(self, grammar: Grammar, ids: Sequence[int], device: torch.device) -> torch.Tensor:
        """(vocab,) bool on `device`: the tokens the grammar allows after the generated `ids`; none
        where `ids` already left it."""
        followed = self._matcher(grammar)
        if followed.follow(ids) < len(ids):
            return torch.zeros(self.vocab, dtype=torch.bool, device=device)
        return self._mask(followed.matcher, device)

    def _mask(self, matcher: llguidance.LLMatcher, device: torch.device) -> torch.Tensor:
        """(vocab,) bool on `device`: the tokens `matcher` allows next, computed on the host."""
        bitmask = torch.full(((self.vocab + 31) // 32,), -1, dtype=torch.int32)
        matcher.unsafe_compute_mask_ptr(bitmask.data_ptr(), bitmask.numel() * bitmask.element_size())
        return unpack(bitmask, self.vocab, device)
