"""Next-token pane: the model's raw top-n with logits, probabilities and bars, after the cursor's
token. After a generated token (or the last prompt token) ▶ marks the token taken; inside the
prompt, ▶ marks the prompt's own next token, which the prefill scored at every position."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.cells import cell_len
from rich.text import Text

from tokenviz.contract.commands import BranchAt, Force, Watch
from tokenviz.contract.features import is_feature_watch
from tokenviz.contract.records import Candidate
from tokenviz.render.bars import bar
from tokenviz.render.columns import cell
from tokenviz.render.units import probability
from tokenviz.render.visible import visible
from tokenviz.ui.panes.base import BoxPane
from tokenviz.ui.screens import WatchScreen
from tokenviz.ui.selection import Selection

MIN_BAR = 2  # cells a probability's bar keeps where a piece takes the rest of its room
PIECE_MOST = 28  # a candidate's piece is shown up to this many cells (the wide layout's pane holds them)


class NextTokenPane(BoxPane):
    TITLE = "next token"

    def __init__(self, final_column: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.final_column = final_column  # a "final p" column: each candidate's p after the settings' stages

    ranks_shown: frozenset[int] = frozenset()  # the ranks on screen: the number keys take only these

    def action_force(self, rank: int) -> None:
        """Take the rank-th candidate shown: the one for the position after the cursor. With the cursor on
        an earlier token, the tokens after it give way (a branch: the old path is kept); on the newest token
        it is the pending step."""
        journey, shown = self.journey, self.ranks_shown
        if shown and rank not in shown:
            self.notify(
                f"candidate {rank} is not on screen (ranks {', '.join(map(str, sorted(shown)))} are): "
                "a taller terminal shows more",
                severity="warning",
            )
            return
        selection = journey.current_selection()
        if selection is None or journey.cursor is None:
            journey.submit(Force(rank=rank))
            return
        if selection.record is None:
            self.notify("inside the prompt, the next token is the prompt's own: e edits it", severity="warning")
            return
        steps_back = len(selection.snapshot.chips) - (selection.cursor + 1)
        journey.cursor = None
        journey.submit(BranchAt(steps_back=steps_back, rank=rank) if steps_back else Force(rank=rank))

    def action_pin(self) -> None:
        """The watch dialog: a candidate at the cursor, or a token typed. The views stay as they are (W
        shows the watched tokens: it toggles, so w opening it would make the W after it close it)."""
        journey = self.journey
        selection = journey.current_selection()
        if selection is None:
            return
        record, prediction = selection.record, selection.prompt_prediction
        top = record.top if record is not None else prediction.top if prediction is not None else ()

        def chosen(token: int | str | None) -> None:
            if isinstance(token, str) and is_feature_watch(token):  # the features view follows it: asked again
                journey.submit(Watch(token=token))
                journey.open_view("features")
            elif token is not None:
                journey.submit(Watch(token=token))
                if journey.current_view != "watch":
                    self.notify("watched at every step: W shows the watched tokens over the steps", timeout=4)

        candidates = [(c.id, c.text) for c in top[:9]]
        self.app.push_screen(WatchScreen(candidates, list(selection.snapshot.pinned)), chosen)

    def draw(self, selection: Selection) -> None:
        record, prediction = selection.record, selection.prompt_prediction
        if record is not None:
            d = record.decision
            own = {c.id: c.prob for c in record.unsteered.top} if record.unsteered else None
            marked = Candidate(d.chosen_id, d.chosen_text, 0.0, d.raw_prob)
            final = d.final_by_id if self.final_column else None
            self.update(self._table(record.top, marked, d.raw_rank, own, selection.info.covers > 0, final))
            state = "pending" if selection.is_pending else "taken"
            u = record.unsteered
            kl = f"KL {'≥ ' if u.kl_floor else ''}{u.kl:.3f}" if u else ""
            from_own = f"{kl} bits from the model's own · " if kl else ""
            if record.interventions and not u:  # a comparison's sides: the journey's interventions, no own pass
                from_own = "under interventions · "
            if record.saturated:  # said first: the flat distribution is the interventions', not the model's
                from_own = f"saturated: the interventions made every logit equal · {from_own}"
            if selection.info.covers:  # a top N (a server's): said first, and the entropy is its floor
                n, vocab, giver = selection.info.covers, selection.info.vocab, selection.info.giver
                said = selection.info.distribution.split(";")[0]  # which top-N, before or after the settings
                self.set_subtitle(
                    f"{from_own}{said}, of {vocab:,} · entropy ≥ {record.entropy:.2f} bits · "
                    f"position {record.position} · {state}",
                    f"{from_own}top {n} of {vocab:,} as {giver} returned them · entropy ≥ {record.entropy:.2f} "
                    f"bits · position {record.position} · {state}",
                    f"{from_own}top {n} of {vocab:,} from {giver} · H ≥ {record.entropy:.2f} · pos {record.position}",
                    f"{kl + ' · ' if kl else ''}{giver.removeprefix('the ')}'s top {n} · H ≥ {record.entropy:.2f} · "
                    f"pos {record.position}",
                )
                return
            narrower = [
                f"{from_own}pos {record.position}",
                f"{kl} · H {record.entropy:.2f} bits · pos {record.position}",
            ]
            self.set_subtitle(
                f"{from_own}entropy {record.entropy:.2f} bits · for position {record.position} · {state}",
                f"{from_own}entropy {record.entropy:.2f} bits · position {record.position}",
                f"{from_own}H {record.entropy:.2f} bits · pos {record.position}",
                *(narrower if kl else []),  # the KL kept first, down to 80 columns
            )
        elif prediction is not None:
            p = prediction
            self.update(self._table(p.top, Candidate(p.next_id, p.next_text, 0.0, p.next_prob), p.next_rank))
            if selection.info.covers:
                giver = selection.info.giver
                self.set_subtitle(
                    f"{giver}'s top {len(p.top)} · entropy ≥ {p.entropy:.2f} bits · position {p.position + 1} · "
                    f"▶ the prompt's own next token (p {probability(p.next_prob)}, rank {p.next_rank})",
                    f"{giver.removeprefix('the ')}'s top {len(p.top)} · H ≥ {p.entropy:.2f} · pos {p.position + 1} · "
                    "▶ the prompt's own",
                )
                return
            self.set_subtitle(
                f"entropy {p.entropy:.2f} bits · for position {p.position + 1} · ▶ the prompt's own next token "
                f"(raw p {probability(p.next_prob)}, rank {p.next_rank})",
                f"entropy {p.entropy:.2f} bits · position {p.position + 1} · ▶ the prompt's own",
                f"H {p.entropy:.2f} · pos {p.position + 1} · ▶ the prompt's own",
            )
        else:
            self.set_subtitle("")
            s = selection.snapshot
            inside = bool(s.records) and selection.cursor < len(s.records[0].input_ids) - 1
            note = (
                "The prompt's predictions at each position are being made (the status line says how far)."
                if inside
                else "No prediction here yet: the model has not read this position."
            )
            self.update(Text(note, style="dim"))

    def _table(
        self,
        top: Sequence[Candidate],
        marked: Candidate,
        marked_rank: int,
        own: dict[int, float] | None = None,
        logprobs: bool = False,
        final: dict[int, float] | None = None,
    ) -> Text:
        """The candidates with `marked` (the token that followed) shown even outside them; with
        interventions on, `own` holds the model's own probabilities (its top-n) for a column. With
        `logprobs`, the scores are a server's log-probabilities, headed so. With `final`, the tokens the
        stages followed have their final probability in a column (— where a stage dropped one), and the
        bars show it: a comparison's two settings side by side."""
        chosen_color = self.theme_colors.chosen
        bar_color = self.theme_colors.bar if final is None else self.theme_colors.bar_final
        rows = max(self.size.height - 1, 3)
        width = max(self.size.width, 24)
        own_w = (8 if own is not None else 0) + (8 if final is not None else 0)
        show_logit = width >= 46 + own_w  # narrow panes drop the logit column first
        piece_w = min(PIECE_MOST, max(6, (width - 40 if show_logit else width - 32) - own_w))
        others = 5 + 7 + (8 if show_logit else 0) + 9 + own_w  # rank, id, logit, raw p, own/final: all but two
        longest = max(cell_len(visible(c.text)) for c in (*top[:rows], marked))
        if longest > piece_w:  # a piece is worth more than a bar beside its number (UX 7's 15: `·Fran…`)
            piece_w = max(piece_w, min(longest, PIECE_MOST, width - others - MIN_BAR))
        fixed = others + piece_w
        bar_width = max(width - fixed, 2)
        text = Text(no_wrap=True, overflow="crop")
        header = f"{'#':>4} {cell('token', piece_w)} {'id':>6}" + (
            f" {'logprob' if logprobs else 'logit':>7}" if show_logit else ""
        )
        extra = (f" {'own p':>7}" if own is not None else "") + (f" {'final p':>7}" if final is not None else "")
        text.append(header + f" {'raw p':>7}" + extra + "\n", style="bold")

        def row(rank: int, piece: str, token_id: int, logit: str, prob: float, mark: bool) -> None:
            style = f"bold {chosen_color}" if mark else ""
            text.append(f"{('▶' if mark else '') + str(rank):>4} ", style=style)
            text.append(cell(visible(piece), piece_w), style=style)
            text.append(f" {token_id:>6}" + (f" {logit:>7}" if show_logit else "") + f" {probability(prob, 7)} ")
            if own is not None:  # the model's own, where it is among its own top-n
                text.append(f"{probability(own[token_id], 7) if token_id in own else '—':>7} ", style="dim")
            if final is not None:  # blank: a token the stages did not follow
                after = final.get(token_id)
                text.append(f"{'' if after is None else '—' if after == 0 else probability(after, 7):>7} ", style=style)
            text.append(bar(prob if final is None else final.get(token_id, 0.0), bar_width) + "\n", style=bar_color)

        shown = list(top[:rows])
        if all(c.id != marked.id for c in shown):
            shown = shown[: rows - 1]  # leave the last row to the marked token, below the others
        for rank, c in enumerate(shown, 1):
            row(rank, c.text, c.id, f"{c.logit:.2f}", c.prob, c.id == marked.id)
        ranks = set(range(1, len(shown) + 1))
        if all(c.id != marked.id for c in shown):
            row(marked_rank, marked.text, marked.id, "", marked.prob, True)
            ranks.add(marked_rank)
        self.ranks_shown = frozenset(ranks)
        text.rstrip()
        return text
