"""At 80x24 the decoded text is readable whole: the tokens pane's text line shows it up to the cursor
(Home brings its beginning back), and D opens it all, wrapped, the token at the cursor marked."""

from apptools import make_app, settle, wait_for

from tokenviz.contract.settings import SamplingSettings
from tokenviz.render.visible import visible
from tokenviz.ui.panes.text import TextPane, chip_spans
from tokenviz.ui.panes.tokens import TEXT_LABEL, TokensPane


def text_line(app) -> str:
    lines = str(app.query_one(TokensPane).render()).splitlines()
    return next(line for line in lines if line.startswith(TEXT_LABEL))[len(TEXT_LABEL) :]


async def test_the_text_is_readable_from_its_beginning_at_80x24():
    app = make_app(SamplingSettings(temperature=0, max_new_tokens=60))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        await pilot.press("a")
        s = await wait_for_stop(app, pilot)
        full = s.full_text.replace("\n", "↵")
        assert len(full) > 80 and text_line(app).startswith("…")  # the newest: the tail
        await pilot.press("home")
        await settle(app, pilot)
        first = text_line(app)
        assert full.startswith(first.rstrip("…").rstrip()) and not first.startswith("…")
        await pilot.press("D")
        await wait_for(lambda: app.query_one("#views").current == "text", pilot)
        body = str(app.query_one(TextPane).body.render())
        assert body == s.full_text  # all of it, for the pane to wrap and scroll
        spans = chip_spans([c.text for c in s.chips], s.full_text)
        assert spans is not None and spans[0] == (0, len(s.chips[0].text))


async def wait_for_stop(app, pilot):
    await wait_for(lambda: app.journey.snapshot is not None and app.journey.snapshot.stop_reason, pilot, timeout=60)
    return await settle(app, pilot)


async def test_the_timing_view_wraps_its_figures_at_80x24():

    app = make_app(SamplingSettings(temperature=0, max_new_tokens=4))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        await pilot.press("space", "space")
        await settle(app, pilot)
        shown = await timing_view(app, pilot, "prefill")
        assert "ms per token)" in shown and "tokens/s from the forward pass alone" in shown


async def timing_view(app, pilot, waited: str) -> str:
    """The timing view opened (i), once it shows `waited`: its text, each line's spaces made one."""
    from tokenviz.ui.panes.timing import TimingPane

    await pilot.press("i")
    await wait_for(lambda: app.query_one("#views").current == "timing", pilot)
    pane = app.query_one(TimingPane)

    def shown() -> str:
        lines = pane.body.render_lines(pane.body.region.reset_offset)  # (the whole body, scrolled or not)
        return " ".join(" ".join("".join(seg.text for seg in strip).strip("│ ").split()) for strip in lines)

    await wait_for(lambda: waited in shown(), pilot)
    return shown()


async def test_at_80x24_the_timing_views_last_lines_scroll_into_view():
    """UX 7's finding 8: at 80x24 the timing view ended at "(the engine's rate)" and PgDn did not scroll it,
    so its lens line could not be read. It scrolls: End brings its last line into the pane."""
    from tokenviz.contract.commands import Inspect
    from tokenviz.ui.panes.timing import TimingPane

    app = make_app(SamplingSettings(temperature=0, max_new_tokens=40))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        await pilot.press("space", "space", "space")
        await settle(app, pilot)
        await pilot.press("l")
        await wait_for(lambda: app.journey.snapshot.result(Inspect) is not None, pilot)
        await settle(app, pilot)
        await timing_view(app, pilot, "lens: ")
        pane = app.query_one(TimingPane)

        def on_screen() -> str:
            strips = app.screen._compositor.render_strips()[pane.region.y : pane.region.bottom]
            return " ".join("".join(seg.text for seg in strip)[pane.region.x : pane.region.right] for strip in strips)

        assert pane.max_scroll_y > 0 and "lens: " not in on_screen()  # (below the fold at 80x24)
        await pilot.press("end")
        await wait_for(lambda: "lens: " in on_screen(), pilot)


async def test_the_branch_tree_wraps_its_figures_at_80x24():
    app = make_app(SamplingSettings(temperature=0, max_new_tokens=20))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        await pilot.press("space", "space", "space")
        await settle(app, pilot)
        await pilot.press("backspace")
        await settle(app, pilot)
        await pilot.press("2")  # another token there: the old path stays as a branch
        s = await settle(app, pilot)
        assert len(s.branches) == 2
        await pilot.press("b")
        await wait_for(lambda: app.query_one("#views").current == "branches", pilot)
        pane = app.query_one("#branches")
        await pilot.pause()
        lines = pane.body.render_lines(pane.body.region.reset_offset)
        shown = " ".join(" ".join("".join(seg.text for seg in line).split()) for line in lines)
        for b in s.branches:  # every branch's figures, whole, each count in generated tokens (UX 7's 17: "60 tok"
            # shared counted the prompt beside "54 tok" generated), and its text wrapped at its words, not in them
            said = "" if b.current else f"its first {b.shared - s.prompt_len} generated as current's · "
            words = " ".join(visible(b.text, spaces=False).split())
            assert f"{b.logprob:.2f}" in shown and f"{b.tokens} generated ·" in shown
            assert f"entropy {b.mean_entropy:.2f} bits · {said}{words}" in shown, shown
        assert "shares" not in shown and " tok " not in shown


async def test_the_lens_header_is_whole_at_80x24():
    app = make_app(SamplingSettings(temperature=0, max_new_tokens=4))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        await pilot.press("l")
        await wait_for(lambda: "layer" in str(app.query_one("#lens").body.render()), pilot)
        pane = app.query_one("#lens")
        lines = pane.body.render_lines(pane.body.region.reset_offset)
        texts = ["".join(seg.text for seg in line).strip() for line in lines]
        header = next(text for text in texts if text.startswith("layer"))
        assert "…" not in header and "top " in header and "p(next)" in header, texts


async def test_the_attention_focus_line_shows_whole_numbers_at_80x24():
    import re

    from tokenviz.ui.panes.attention import AttentionPane

    app = make_app(SamplingSettings(temperature=0, max_new_tokens=4))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        pane = app.query_one(AttentionPane)
        await wait_for(lambda: "attends to" in str(pane.render_lines(pane.region.reset_offset)), pilot)
        line = next(
            "".join(seg.text for seg in strip)
            for strip in pane.render_lines(pane.region.reset_offset)
            if "attends to" in "".join(seg.text for seg in strip)
        )
        focus = line.split("attends to:", 1)[1].strip(" │")
        assert "…" not in focus and re.fullmatch(r"(\S+ [01]\.\d\d)(  \S+ [01]\.\d\d)*", focus), focus


async def test_the_watch_view_says_whole_lines_at_80x24():
    from textual.widgets import Input

    app = make_app(SamplingSettings(temperature=0, max_new_tokens=8))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        await pilot.press("W")
        await wait_for(lambda: app.query_one("#views").current == "watch", pilot)
        pane = app.query_one("#watch")
        await pilot.pause()

        def on_screen() -> str:
            lines = pane.body.render_lines(pane.body.region.reset_offset)
            return " ".join(" ".join("".join(seg.text for seg in line).split()) for line in lines)

        assert "split by layer" in on_screen()  # the note wraps whole
        for token in ("id:5", "id:9"):
            await pilot.press("w")
            await wait_for(lambda: app.screen.query(Input), pilot)
            app.screen.query_one(Input).value = token
            await pilot.press("enter")
            await settle(app, pilot)
        await wait_for(lambda: "direct logit attribution" in on_screen(), pilot, timeout=30)
        assert "█ p 1" in on_screen() and "sum " in on_screen()  # the scale's key, the sum: whole


async def test_after_a_stop_the_text_line_ends_with_the_token_the_stop_took():
    """The cursor rests on the newest token the model read; the token taken at the stop (never fed)
    is still the text's end, as trace's text is (it had been dropped from the line)."""
    from tokenviz.contract.text import safe_text

    app = make_app(SamplingSettings(temperature=0, max_new_tokens=4))
    async with app.run_test(size=(200, 60)) as pilot:
        await settle(app, pilot)
        await pilot.press("a")
        s = await wait_for_stop(app, pilot)
        assert s.stop_reason and s.chips[-1].text
        assert text_line(app).rstrip() == safe_text(s.full_text.replace("\n", "↵").replace("\t", " ")).rstrip()
        assert s.full_text.endswith(s.chips[-1].text)


async def test_d_opens_on_the_answer_not_the_top_of_a_long_prompt():
    """Issue 51, item 11: in chat, D opened on the system prompt; the answer had to be scrolled to.
    It opens with the answer's first line in view (two lines of the prompt above it), and after a
    scroll a redraw keeps the reader's place."""
    prompt = "".join(f"line {i}\n" for i in range(40)) + "And so"
    app = make_app(SamplingSettings(temperature=0, max_new_tokens=4), prompt=prompt, context=1024)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        await pilot.press("space", "space")
        s = await settle(app, pilot)
        await pilot.press("D")
        await wait_for(lambda: app.query_one("#views").current == "text", pilot)
        pane = app.query_one(TextPane)
        await wait_for(lambda: pane.scroll_y > 0, pilot)
        top, height = round(pane.scroll_y), pane.scrollable_content_region.height
        lines = s.full_text.splitlines()
        answer_line = len(lines) - 1  # the answer continues the prompt's last line ("And so …")
        assert top <= answer_line < top + height, (top, answer_line)
        assert answer_line - top == 2 or top == round(pane.max_scroll_y)  # (a short answer: as far as it scrolls)
        pane.scroll_to(y=0, animate=False)
        await pilot.pause(0.2)
        await pilot.press("space")
        await settle(app, pilot)
        await pilot.pause(0.2)
        assert pane.scroll_y == 0  # (a step redraws the view; only opening it again moves it)
        await pilot.press("D", "D")  # closed and opened again: on the answer again
        await wait_for(lambda: pane.scroll_y > 0, pilot)


async def test_a_line_too_long_for_its_view_ends_in_an_ellipsis_and_speculations_summary_is_whole():
    """Issue 51, item 11: the lens cut 'never settles as to', attribution 'the first-order ch', and the
    speculation view's first line '… · 2% of 50…' mid-figure. A cut line now ends in '…', and the
    speculation summary is one of its whole variants at 120x36."""
    from tokenviz.contract.commands import Attribute, Speculate
    from tokenviz.ui.panes.attribution import AttributionPane
    from tokenviz.ui.panes.speculation import SpeculationPane

    app = make_app(SamplingSettings(temperature=0, max_new_tokens=8), prompt="The cat sat on the mat. The cat sat")
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(app, pilot)
        await pilot.press("S")
        await wait_for(lambda: app.journey.snapshot.result(Speculate) is not None, pilot, timeout=30)
        await pilot.pause(0.2)
        pane = app.query_one(SpeculationPane)
        lines = pane.body.render_lines(pane.body.region.reset_offset)
        first = "".join(seg.text for seg in lines[0]).rstrip()
        spec = app.journey.snapshot.result(Speculate)
        assert "…" not in first and f"{spec.acceptance_rate:.0%}" in first and f"{len(spec.ids)} tok" in first
    app = make_app(SamplingSettings(temperature=0, max_new_tokens=4))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        app.journey.query_one(AttributionPane).action_attribution("grad")  # (its method line is longer than 80 columns)
        await wait_for(lambda: app.journey.snapshot.result(Attribute) is not None, pilot, timeout=30)
        await pilot.pause(0.2)
        pane = app.query_one(AttributionPane)
        whole = str(pane.body.render()).splitlines()
        shown = [
            "".join(seg.text for seg in line).rstrip() for line in pane.body.render_lines(pane.body.region.reset_offset)
        ]
        cut = [(full, line) for full, line in zip(whole, shown) if line.strip() and full.rstrip() != line]
        assert cut and all(line.endswith("…") for _, line in cut), (cut, whole, shown)


async def test_the_sampling_pane_at_80x24_gives_its_rows_to_the_kept_tokens():
    """Issue 51, item 11: at 80x24 the sampling pane's stages took two lines and left rows for 2 of the
    kept tokens. A short pane says the stages in one compact line (each stage's setting and how many
    it kept), and the rows go to the tokens."""
    from tokenviz.ui.panes.sampling import SamplingPane

    app = make_app(SamplingSettings(temperature=0.7, top_k=8, top_p=0.9, seed=1))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        await pilot.press("space")
        s = await settle(app, pilot)
        await pilot.pause(0.2)
        d = s.pending.decision
        lines = str(app.query_one(SamplingPane).content).splitlines()
        assert lines[0] == "softmax → temp 0.7: 300 → top-k 8: 8 → top-p 0.9: " + f"{d.stages[-1].kept} → draw"
        rows = lines[2:-1]  # after the stages and the header, before the draw
        kept = sum(p > 0 for p in d.final_probs)
        assert len(rows) >= min(kept, 3), lines
    app = make_app(SamplingSettings(temperature=0.7, top_k=8, top_p=0.9, seed=1))
    async with app.run_test(size=(160, 48)) as pilot:  # room enough: the stages in full
        await settle(app, pilot)
        assert str(app.query_one(SamplingPane).content).startswith("logits → softmax → temperature")


async def test_the_timing_views_two_rates_are_of_the_same_steps_and_all_work_is_never_faster():
    """(Issue 69, finding 2: "1.0 tokens/s from the forward pass alone" beside "engine rate, all work
    included: 1.1 tokens/s": the forward's rate was over every step, the engine's over the last 16.)"""
    import re

    app = make_app(SamplingSettings(temperature=0, max_new_tokens=40))
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(app, pilot)
        for _ in range(20):  # (more steps than the rate's window)
            await pilot.press("space")
        s = await settle(app, pilot)
        assert s.rate_steps == 16 and s.forward_tokens_per_s >= s.tokens_per_s
        shown = await timing_view(app, pilot, "last 16 steps")
        found = re.search(r"the last 16 steps: ([\d.]+) tokens/s from the forward pass alone, ([\d.]+) with all", shown)
        assert found is not None, shown
        assert float(found[1]) >= float(found[2])


async def test_after_r_no_decode_rate_is_said_until_a_step_is_taken():
    """(Issue 69, finding 24: after r, the status line still showed the previous decode rate.)"""
    from tokenviz.ui.panes.status import StatusLine

    app = make_app(SamplingSettings(temperature=0, max_new_tokens=40))
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(app, pilot)
        await pilot.press("space", "space", "space")
        s = await settle(app, pilot)
        assert s.tokens_per_s is not None
        await pilot.press("r")
        s = await settle(app, pilot)
        assert s.tokens_per_s is None and len(s.chips) == s.prompt_len
        assert "tok/s" not in str(app.query_one(StatusLine).render())
        await pilot.press("space")
        s = await settle(app, pilot)
        assert s.tokens_per_s is not None and s.rate_steps == 1


async def test_the_timing_view_says_the_lens_own_cost():
    """Issue 70: the lens's own cost was never shown (the status line and `i` gave the step's time only).
    The timing view says the lens last computed, where, and its milliseconds, as the journey measured them;
    a position seen before is shown again at no cost and leaves the figure as it was."""
    import re

    from tokenviz.contract.commands import Inspect

    app = make_app(SamplingSettings(temperature=0, max_new_tokens=40))
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(app, pilot)
        await pilot.press("space", "space")
        s = await settle(app, pilot)
        assert s.lens_ms is None  # (no lens yet: the view says nothing of it)
        await pilot.press("l")
        await wait_for(lambda: app.journey.snapshot.result(Inspect) is not None, pilot)
        s = await settle(app, pilot)
        position, ms = s.lens_ms
        assert position == s.result(Inspect).position and ms > 0
        shown = await timing_view(app, pilot, "lens: ")
        found = re.search(r"lens: ([\d.]+) (ms|s) at position (\d+), its own cost \(its own pass", shown)
        assert found and int(found[3]) == position, shown
        await pilot.press("l", "left")  # the lens again, at another position: computed, the figure its
        await wait_for(lambda: app.journey.snapshot.lens_ms[0] == position - 1, pilot)
        await pilot.press("right")  # back: kept from before, at no cost, and the figure stays the last computed
        await settle(app, pilot)
        assert app.journey.snapshot.lens_ms[0] == position - 1


def test_a_served_models_lens_cost_says_where_its_work_is_done():
    from tokenviz.ui.panes.timing import lens_cost

    assert str(lens_cost(None, remote=True)) == ""
    said = str(lens_cost((7, 212.5), remote=True))
    assert "lens: 212.5 ms at position 7" in said and "the server's activations, the head applied here" in said


async def test_at_200_columns_the_next_token_pane_gives_pieces_room():
    """UX 7's finding 24: at 200 columns the next-token pane stayed 54 columns wide and cut pieces at 16 cells
    while the attention pane beside it was mostly empty. From 180 columns it is wider and its pieces' column
    grows (26 cells here); at 120 it is as it was (14)."""
    import re

    from tokenviz.ui.panes.next_token import NextTokenPane

    for size, pieces in (((200, 60), 26), ((120, 36), 14)):
        app = make_app(SamplingSettings(temperature=0))
        async with app.run_test(size=size) as pilot:
            await settle(app, pilot)
            header = str(app.query_one(NextTokenPane).content).splitlines()[0]
            spaces = re.search(r"token( +)id", header)
            assert spaces and len("token") + len(spaces[1]) - 5 == pieces, (size, header)  # (5: " " and "    ")


async def test_at_80x24_the_text_views_subtitle_is_whole():
    """UX 7's finding 15, its last part: at 80x24 the text view's subtitle was cut ("54 generated tok…"). It is
    the fullest of its ways to say it that fits the border: here the figures without the scroll keys."""
    from rich.cells import cell_len

    app = make_app(SamplingSettings(temperature=0, max_new_tokens=60))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        await pilot.press(*["space"] * 12)
        s = await settle(app, pilot)
        await pilot.press("D")
        await wait_for(lambda: app.query_one("#views").current == "text", pilot)
        pane = app.query_one(TextPane)
        generated = len(s.chips) - s.prompt_len
        await wait_for(lambda: f"{generated} generated" in str(pane.border_subtitle), pilot)
        subtitle = str(pane.border_subtitle)
        assert cell_len(subtitle) <= pane.size.width - 6 and "…" not in subtitle, subtitle


async def test_a_bos_the_tokenizer_adds_is_a_chip_not_text():
    """UX 7's finding 24: a Gemma journey's text began `<bos>`, a token no one wrote. A special token the
    tokenizer adds to the prompt (here the tiny tokenizer made to add one, as Gemma's does) stays a chip in
    the tokens pane; the text view and the tokens pane's text line leave it out, the rest whole."""
    import copy

    from textual.widgets import Static
    from tiny import EOS, tiny_model
    from tokenizers import processors

    from tokenviz.backends.transformers.runner import ModelRunner
    from tokenviz.contract.settings import SamplingSettings
    from tokenviz.ui.app import TokenvizApp
    from tokenviz.ui.panes.tokens import TokensPane
    from tokenviz.worker.engine_thread import EngineWorker

    loaded = tiny_model("llama")
    loaded.tokenizer = copy.deepcopy(loaded.tokenizer)  # (the tiny tokenizer is shared: this one alone changes)
    bos = loaded.tokenizer.convert_tokens_to_ids(EOS)
    loaded.tokenizer._tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{EOS} $A", special_tokens=[(EOS, bos)]
    )
    prompt = "The cat sat on the mat"
    app = TokenvizApp(EngineWorker(lambda progress: ModelRunner(loaded), SamplingSettings(temperature=0), prompt))
    async with app.run_test(size=(120, 36)) as pilot:
        s = await settle(app, pilot)
        assert s.chips[0].id == bos and s.chips[0].is_special and s.full_text.startswith(EOS)  # as Gemma's
        tokens = str(app.query_one(TokensPane).render())
        assert f"text: {prompt}" in tokens and f"text: {EOS}" not in tokens, tokens
        await pilot.press("D")
        await wait_for(lambda: app.query_one("#views").current == "text", pilot)
        body = str(app.query_one("#text").query_one(".body", Static).render())
        assert body.startswith(prompt) and EOS not in body, body


async def test_at_80x24_a_piece_takes_the_bars_room_before_it_is_cut():
    """UX 7's finding 15: at 80x24, with the model's own column beside (an intervention on) or a comparison's
    final column, the next-token pane cut `·France` to `·Fran…` while its bars kept six cells. A piece longer
    than its column takes the bar's room first (the bar keeps two cells): `·France` whole; a piece longer
    than the pane can give is cut, the bar kept."""
    from tokenviz.contract.records import Candidate
    from tokenviz.ui.panes.next_token import MIN_BAR, NextTokenPane

    app = make_app(SamplingSettings(temperature=0))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        pane = app.query_one(NextTokenPane)
        top = [Candidate(1, " France", 3.0, 0.6), Candidate(2, " Paris", 2.0, 0.3)]
        own = {1: 0.5, 2: 0.4}
        rows = str(pane._table(top, top[0], 1, own=own)).splitlines()
        assert "·France " in rows[1] and "…" not in rows[1], rows
        assert all(len(row.rstrip()) <= pane.size.width for row in rows), rows
        long = [Candidate(1, " " + "x" * 40, 3.0, 0.6)]
        row = str(pane._table(long, long[0], 1, own={1: 0.5})).splitlines()[1]
        shown = row.rstrip()
        assert "…" in shown and len(shown) <= pane.size.width and not shown[-MIN_BAR:].strip("█▏▎▍▌▋▊▉"), row
