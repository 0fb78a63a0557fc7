"""Whether the lens is in use, for a backend whose steps read the lens's rows in their own pass (the
transformers and llama.cpp backends): once the lens is asked for, the next IN_USE_STEPS steps feeding one
token read its rows as they go (the lens view asks at each step it shows), and the rows of the last
STEPS_KEPT steps are kept (a step feeds the token just chosen; the lens view shows the one before it).
Once the lens has been closed that long, a step reads nothing and costs what the model's own step costs."""

from __future__ import annotations

IN_USE_STEPS = 4  # steps after the lens was asked for that read its rows in their own pass
STEPS_KEPT = 2  # steps whose rows are kept


class LensInUse:
    def __init__(self) -> None:
        self.steps_left = 0  # steps that still read the lens's rows

    def asked(self) -> None:
        """The lens was asked for: the next steps read its rows."""
        self.steps_left = IN_USE_STEPS

    def reads_rows(self, fed: int) -> bool:
        """Whether a pass feeding `fed` tokens reads the lens's rows (counting one step of its use)."""
        if fed != 1 or self.steps_left <= 0:
            return False
        self.steps_left -= 1
        return True
