"""Which token a person means when they ask to watch one: an id ("id:7042"), or a text that the
tokenizer makes into exactly one token (" Paris", with its leading space)."""

from __future__ import annotations

from tokenviz.contract.engine import Engine
from tokenviz.contract.errors import TokenvizError

ID_PREFIX = "id:"


def token_of(runner: Engine, spec: int | str, purpose: str = "watch") -> int:
    """The token id `spec` names; one clear line when it names none, or several. `purpose` is what the
    token is for, as the line says it ("watch", "steer by")."""
    vocab = runner.info.vocab
    if isinstance(spec, str) and spec.startswith(ID_PREFIX):
        digits = spec[len(ID_PREFIX) :].strip()
        if not digits.isdigit():
            raise TokenvizError(f"{spec!r} is not a token id: write id: and a number, like id:42")
        spec = int(digits)
    if isinstance(spec, int):
        if not 0 <= spec < vocab:
            raise TokenvizError(f"token id {spec} is outside the vocabulary (0-{vocab - 1})")
        return spec
    if not spec:
        raise TokenvizError(f"type a token to {purpose}: its text (with its leading space) or id:N")
    ids = [t for t in runner.encode(spec) if t not in runner.special_ids or runner.piece(t) == spec]
    if len(ids) != 1:
        pieces = " ".join(repr(runner.piece(t)) for t in ids[:6])
        raise TokenvizError(
            f"{spec!r} is {len(ids)} tokens ({pieces}), not one: {purpose} a single token, or give its id as id:N"
        )
    return ids[0]
