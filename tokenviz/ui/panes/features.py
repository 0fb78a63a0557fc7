"""Features view: what each sparse autoencoder loaded reads in the residual at the cursor's position (the
pass that gave the token after it): its active features strongest first, each one's activation and share
of the residual's squared norm, how many are on (L0) and what the SAE leaves unexplained."""

from __future__ import annotations

from rich.style import Style
from rich.text import Text

from tokenviz.contract.commands import LabelFeatures, ReadFeatures
from tokenviz.contract.features import FeatureLabels, FeatureReading, FeatureReadings, WatchedFeature
from tokenviz.render.bars import bar
from tokenviz.render.sparkline import sparkline
from tokenviz.render.visible import visible
from tokenviz.ui.panes.base import RowsPane, Run, result_or_note
from tokenviz.ui.selection import Selection

RUN = Run(ReadFeatures, "view('features')")
EXPLAINED = "activation, share of the residual's |x|² (decoded row · x), ↑ tokens it promotes; L0 = features on"
LABEL_CELLS = 28  # a feature's label: the tokens its row promotes most
HOW_TO_CHANGE = "w feature:SAE:ID follows one; I, then sae-steer SAE:ID:S or sae-clamp SAE:ID:V changes one"


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
        for watched in s.watched_features:
            self._watched(text, watched, read.position, width)
        room = self.size.height - 4 - 2 * len(read.readings) - len(s.watched_features)
        rows = max(room, 1) // max(len(read.readings), 1)
        labels = s.result(LabelFeatures) or FeatureLabels(())
        for reading in read.readings:
            self._reading(text, labels, reading, width, rows)
        text.append(HOW_TO_CHANGE, Style(dim=True))
        self.body.update(text)

    def _watched(self, text: Text, watched: WatchedFeature, cursor: int, width: int) -> None:
        """A watched feature: its activation at each step up to the cursor, as a sparkline, and there."""
        label = f"★ {visible(watched.sae)}#{watched.id} "
        values = [a for p, a in zip(watched.positions, watched.activations) if p <= cursor]
        room = max(width - len(label) - 12, 4)
        text.append(label, Style(bold=True))
        line = sparkline(values, room) or ("off at every step" if values else "(the prompt: from its last token on)")
        text.append(line, Style(color=self.theme_colors.bar))
        text.append(f" {values[-1]:9.3f}\n" if values else "\n")

    def _reading(self, text: Text, labels: FeatureLabels, reading: FeatureReading, width: int, rows: int) -> None:
        text.append(f"{visible(reading.sae)} L{reading.layer}", Style(bold=True))
        text.append(f"  L0 {reading.l0}  error {reading.error:.1%}\n", Style(dim=True))
        if not reading.features:
            text.append("  no feature is on here\n", Style(dim=True))
            return
        top = max(f.activation for f in reading.features) or 1.0
        bar_w = max(min(width - 32 - LABEL_CELLS, 24), 4)
        for f in reading.features[:rows]:
            text.append(f"  #{f.id:<7}", Style(bold=True))
            text.append(f"{f.activation:9.3f} ")
            text.append(bar(f.activation / top, bar_w), Style(color=self.theme_colors.bar))
            text.append(f" {f.share:+6.1%}")
            label = labels.label_of(reading.sae, f.id)
            if label is not None:
                said = label.description or "↑" + " ".join(visible(t) for t in label.promotes[:3])
                text.append(f" {said}", Style(dim=True))
            text.append("\n")
        strongest = labels.label_of(reading.sae, reading.features[0].id)
        if strongest is not None and strongest.contexts:  # (sae-index's, over the user's text)
            text.append(f"  #{strongest.id} is strongest in: {visible(strongest.contexts[0])}\n", Style(dim=True))
