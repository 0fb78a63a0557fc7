"""A continuation (Continue): the user's text as tokens forced one step at a time, at autoplay's pace."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from tokenviz.contract.errors import TokenvizError


class Continuation:
    """The tokens of a text still to force, and how many it had: any move of the user's ends it."""

    def __init__(self) -> None:
        self.left: deque[int] = deque()
        self.total = 0

    @property
    def active(self) -> bool:
        return self.total > 0

    @property
    def through(self) -> bool:
        return not self.left

    def begin(self, ids: Iterable[int]) -> None:
        """Force these tokens next, one a step."""
        self.left.extend(ids)
        if not self.left:
            raise TokenvizError("type some text to continue with")
        self.total = len(self.left)

    def next_token(self) -> int | None:
        """The next token to force (None: none, the model's own decision is taken)."""
        return self.left.popleft() if self.left else None

    def again(self, token: int) -> None:
        """`token` was not taken (its step gave way to a key): it is the next one again."""
        self.left.appendleft(token)

    def line(self) -> str:
        """The status line while it runs."""
        return f"continuing with your text: {self.total - len(self.left)} of {self.total} tokens (any move stops it)"

    def end(self) -> None:
        self.left.clear()
        self.total = 0
