"""Features view: what each sparse autoencoder loaded reads in the residual at the cursor's position (the
pass that gave the token after it): its active features strongest first, each one's activation and share
of the residual's squared norm, how many are on (L0) and what the SAE leaves unexplained."""

from __future__ import annotations

from rich.style import Style
from rich.text import Text

from tokenviz.contract.commands import ReadFeatures
from tokenviz.contract.features import FeatureReading, FeatureReadings
from tokenviz.render.bars import bar
from tokenviz.render.visible import visible
from tokenviz.ui.panes.base import RowsPane, Run, result_or_note
from tokenviz.ui.selection import Selection

RUN = Run(ReadFeatures, "view('features')")
EXPLAINED = "activation, and its share of the residual's |x|² (its decoded row · x); L0 = features on"
HOW_TO_CHANGE = "change one: I, then sae-steer SAE:ID:STRENGTH or sae-clamp SAE:ID:VALUE"


def current_features(selection: Selection) -> FeatureReadings | None:
    """The snapshot's readings if they are of the cursor's position of this journey, else None."""
    s = selection.snapshot
    read = s.result(ReadFeatures)
    if read is None or read.position != selection.cursor or selection.cursor >= len(s.chips):
        return None
    return read if read.ids == tuple(chip.id for chip in s.chips[: selection.cursor + 1]) else None


class FeaturesPane(RowsPane):
    TITLE = "SAE features"

    def draw(self, selection: Selection) -> None:
        waiting = "reading the residual at the cursor with each SAE…"
        read = result_or_note(current_features(selection), selection, self.body, waiting, "SAE features", RUN)
        if read is None:
            return
        s = selection.snapshot
        width = max(self.size.width - 3, 30)
        text = Text(no_wrap=True, overflow="ellipsis")
        piece = visible(s.chips[read.position].text)
        text.append(f"@{read.position} {piece}: the residual there, as each SAE reads it\n", Style(bold=True))
        text.append(EXPLAINED + "\n", Style(dim=True))
        rows = max(self.size.height - 4 - 2 * len(read.readings), 1) // max(len(read.readings), 1)
        for reading in read.readings:
            self._reading(text, reading, width, rows)
        text.append(HOW_TO_CHANGE, Style(dim=True))
        self.body.update(text)

    def _reading(self, text: Text, reading: FeatureReading, width: int, rows: int) -> None:
        text.append(f"{visible(reading.sae)} L{reading.layer}", Style(bold=True))
        text.append(f"  L0 {reading.l0}  error {reading.error:.1%}\n", Style(dim=True))
        if not reading.features:
            text.append("  no feature is on here\n", Style(dim=True))
            return
        top = max(f.activation for f in reading.features) or 1.0
        bar_w = max(width - 32, 4)
        for f in reading.features[:rows]:
            text.append(f"  #{f.id:<7}", Style(bold=True))
            text.append(f"{f.activation:9.3f} ")
            text.append(bar(f.activation / top, bar_w), Style(color=self.theme_colors.bar))
            text.append(f" {f.share:+6.1%}\n")
