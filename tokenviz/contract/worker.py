"""What the app holds: a worker that owns a model (or a recording) in its own thread. The app
starts it, submits commands and stops it; the worker hands frozen snapshots back through `post`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

from tokenviz.contract.commands import Command, Start
from tokenviz.contract.settings import SamplingSettings
from tokenviz.contract.snapshot import ComparisonSnapshot, Snapshot

S = TypeVar("S", Snapshot, ComparisonSnapshot, covariant=True)

Post = Callable[[S], object]  # hands a snapshot to the UI; must be thread-safe


class Worker(Protocol[S]):
    """A journey's worker (S = Snapshot) or a comparison's (S = ComparisonSnapshot)."""

    @property
    def submitted(self) -> int:
        """Commands submitted so far (a snapshot's `handled` catches up with it)."""

    @property
    def writes_pending(self) -> int:
        """Saves submitted and not yet written: quitting waits for them (see stop)."""

    @property
    def write_failures(self) -> list[str]:
        """What the writes finished while stopping could not do, one line each (for the command line)."""

    def start(self, post: Callable[[S], object]) -> None:
        """Start the thread; it calls `post`, from its own thread, with each snapshot it makes."""

    def submit(self, command: Command) -> None:
        """Queue `command`: the thread runs the commands in order (a refusal is a snapshot's error)."""

    def cancel(self) -> None:
        """Cancel a long run (a prefill, beams, speculation, attribution) at its next chunk."""

    def space_frames(self, seconds: float) -> None:
        """During autoplay publish at most one frame per `seconds` (the app draws no more often)."""

    def stop(self, timeout: float = 1.0) -> bool:
        """Ask the thread to end, after the Saves already submitted; True once it has."""

    def count_tokens(self, text: str) -> int | None:
        """How many tokens the model's tokenizer makes of `text` (the prompt editor's count); None where
        no tokenizer is here (loading, a recording, a served model's). Called off the UI thread."""

    def compare(self, a: SamplingSettings, b: SamplingSettings, prompt: Start) -> Worker[ComparisonSnapshot]:
        """A worker that runs `prompt` twice on this worker's model, by settings `a` and `b`, stepped
        together (TokenvizError where it cannot: a recording has no model)."""
