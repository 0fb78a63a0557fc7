"""Modal screens: the help screen (its key table comes from tokenviz.ui.keys), the prompt editor, the
continuation, comparison and watch dialogs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, TypeVar

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.await_complete import AwaitComplete
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.timer import Timer
from textual.widgets import Checkbox, Input, Label, Markdown, OptionList, TextArea
from textual.widgets.option_list import Option

from tokenviz.contract.grammar import Grammar
from tokenviz.contract.interventions import Entries
from tokenviz.render.visible import visible
from tokenviz.ui.keys import COMPARE_KEYS, markdown_table

HELP = f"""\
# tokenviz: watch the model think

Each step the model reads the tokens so far, runs them through every layer, and scores every token
in its vocabulary (the **logits**). Softmax turns the scores into **probabilities**; the sampling
stages reshape them; a draw picks one token; it is appended and the loop repeats, reusing the
**KV cache** so only the new token is computed.

## Panes

- **tokens**: the prompt and the generated tokens (chips of two colours, the theme's), each with its id. `·` is a
  space, `↵` a newline, `<0x..>` a byte that is only part of a character or a control character,
  `⟨…⟩` a special token.
  The underlined chip is the cursor (←/→); the other panes follow it. "next" is the pending choice.
- **attention**: the causal attention matrix of one layer: row = the token reading (query), column
  = the token read (key); more weight = further along the theme's colour scale (brighter on a dark
  theme, darker on a light one); a row has no cells past its own token (none reads the future).
  Two matrix rows per terminal row. `mean`/`max` combine heads; a single head shows its key/value
  group (heads share K/V in grouped-query attention). The line below names the tokens the cursor attends to most.
- **next token**: the model's own top-n for the position after the cursor: logit, probability, a
  bar. Entropy (bits) says how unsure the model is. ▶ marks the token taken, with its rank.
- **sampling**: the stages in order (penalties → temperature → top-k → top-p → min-p), how many
  tokens each kept and how much probability mass survived, the distribution before (raw) and after
  (final), and the decision: the uniform draw *u* and the cumulative band it fell in.
- **lens / embedding / KV cache / timing** (keys l, m, c, i) take the attention pane's place; the
  same key brings attention back. The lens shows, for every layer, what the model would predict if
  it stopped there; ★ marks the layer from which the chosen token stays on top.
- **attribution** (key A): why the token after the cursor: how much each earlier token raised (+) or
  lowered (−) its log-probability, strongest first, and the chips shaded by it. Leave-one-out takes
  each token out in turn and runs the model again (exact; slow on long texts, Escape cancels);
  gradient × input, from the palette, estimates the same from one backward pass.
- **continue with this text** (key f): type a text of your own and each of its tokens is taken as a
  forced step, at autoplay's pace; the next-token and sampling panes show how likely the model found
  each one, and u shades every chip by its surprisal.
- **watched tokens** (w chooses one, W shows them): a token you follow at every step, from the
  candidates or typed: its raw and final probability over the whole journey and its rank at the
  cursor's step; the lens gains a ★ column for it. With two watched (the two watched last), why the model prefers
  one: logit(a) − logit(b) after the cursor split into what the embeddings and each layer's
  attention and MLP wrote into the residual stream (through the final norm as the forward pass
  scaled it); the shares add up to the model's own difference.
- **SAE features** (key F; E adds a sparse autoencoder from its folder, or start with --sae DIR): what
  each SAE reads in the residual after its layer at the cursor: its active features strongest first, each
  one's activation, its share of the residual, and the tokens its decoder row promotes (a lens of the
  feature); L0 counts the features on, error is what the SAE leaves unexplained. w feature:SAE:ID follows
  one at every step (a sparkline up to the cursor; a chart in C); I steers (sae-steer) or clamps
  (sae-clamp) one.
- **charts** (key C): the journey at a glance: entropy and the chosen token's probability by step,
  the watched tokens' probability, the watched SAE features' activation, the prompt's surprisal, decode
  time against context length, and the KV cache's size against tokens.
- **status**: model, device, dtype, step, position, forward time, tokens/s, KV cache size, state; once
  the journey stops, why its text looks as it does ("why: cut off mid-sentence (the new-token limit)",
  "repetitive", "inconsistent or incoherent"), as measured; y opens them all with the evidence by position
  and the remedy (trace --json gives the same).

## Keys

{markdown_table()}

Settings keys re-decide the pending token from the logits already computed: only a step runs the model.
"""


COMPARE_HELP = f"""\
# tokenviz compare: two journeys, one prompt

A and B read the same prompt and step together. B differs from A by its sampling settings, its
dtype or its model (one tokenizer). Each side shows its tokens and the model's top candidates for
the next one, after the cursor.

## How they differ

- **KL raw**, KL(A ‖ B) in bits of the two raw next-token distributions: the models' own. Two
  sampling settings on one model give 0: settings reshape the final distribution, not the raw one.
- **KL final**, of the two distributions the draws are made from: where a sampling setting shows
  (∞ where A keeps a token B's stages removed).
- **†**: after the paths part, B's figures are B's model and settings on A's path (fed A's tokens),
  so each row compares one context.
- **top-1**: whether both models' most likely next token is the same.
- **Δp**: A's probability of the token A chose minus B's (raw distributions).
- **A ranks B / B ranks A**: the rank each gives the token the other chose.
- **▼ the paths part at step N**: the first step where A and B took different tokens, marked
  reversed in both strips.
- **The chart**: each step's KL, one column a step; **▲** under it where the top-1s differ (p
  and P move the cursor to the next and the previous).
- **The line above it**: the steps in llama-perplexity's terms (`--kl-divergence`), B the base
  and A's tokens the text: the mean KLD, KL(B ‖ A) in nats; how often both top-1s are the same
  token; the RMS of Δp; PPL(A) / PPL(B). `score --against-model` gives them over a whole text.

## Keys

{markdown_table(COMPARE_KEYS)}
"""


Answer = TypeVar("Answer")


class Dialog(ModalScreen[Answer]):
    """A modal screen that answers once: the first answer (Enter, Escape, a choice) closes it, and one that
    arrives as it closes is dropped. Enter then Escape typed at once (a loaded machine) had Escape close it
    first, then its field's Enter answer again: the typed answer taken after the user's cancel, and the
    screen under it popped, a traceback."""

    def dismiss(self, result: Answer | None = None) -> AwaitComplete:
        if not self.is_active:
            return AwaitComplete()  # (nothing to wait for)
        return super().dismiss(result)


class HelpScreen(Dialog[None]):
    BINDINGS: ClassVar = [Binding("escape,q,question_mark", "dismiss", "close")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: 90%; max-width: 110; height: 90%; border: thick $primary;
                                  background: $surface; padding: 0 1; }
    """

    def __init__(self, text: str = HELP):
        super().__init__()
        self.text = text

    def compose(self) -> ComposeResult:
        with VerticalScroll() as box:
            box.border_title = "help"
            box.border_subtitle = "Escape, q or ? closes it · ↑ ↓ PgUp PgDn scroll"
            yield Markdown(self.text, id="help")


@dataclass(frozen=True)
class PromptChoice:
    text: str
    chat: bool  # put it through the model's chat template as a user message


class OnOffBox(Checkbox):
    """A checkbox whose mark says its state: ✓ when on, an empty box when off (Textual's draws an X
    both ways, only its colour changing, and an X reads as ticked)."""

    @property  # read by ToggleButton where it draws the button
    def BUTTON_INNER(self) -> str:  # type: ignore[override]
        return "✓" if self.value else " "


class PromptScreen(Dialog[PromptChoice | None]):
    """The prompt editor: several lines of text, and for a model with a chat template a switch
    between a chat message and plain text to continue, set as the journey is."""

    BINDINGS: ClassVar = [
        Binding("escape", "cancel", "cancel"),
        Binding("ctrl+s", "start", "start"),
        Binding("ctrl+a", "select_all", "select all", priority=True),  # TextArea's own: to the line's start
        Binding("ctrl+l", "clear", "clear"),
    ]
    DEFAULT_CSS = """
    PromptScreen { align: center middle; }
    PromptScreen > Vertical { width: 80%; max-width: 100; height: auto; border: thick $primary;
                              background: $surface; padding: 1 2; }
    PromptScreen TextArea { height: 8; }
    PromptScreen Label { width: 100%; }
    PromptScreen Checkbox { width: 100%; }  /* its label, where the dialog is narrower, ends in … (never cut bare) */
    /* The chat switch reads on a projector, on and off: its mark at least 3:1 on its own background. */
    PromptScreen Checkbox > .toggle--button { color: $foreground 55%; background: $panel; }
    PromptScreen Checkbox.-on > .toggle--button { color: $success; }
    """

    COUNT_AFTER_S = 0.2  # the token count follows the text this long after the last change (a paste, typing)

    def __init__(
        self,
        prompt: str,
        can_chat: bool,
        chat: bool = True,
        count: Callable[[str], int | None] | None = None,
        context: int | None = None,
    ):
        super().__init__()
        self.prompt = prompt
        self.can_chat = can_chat
        self.chat = chat  # the journey's mode: the switch starts there
        self.count = count  # the model's tokenizer's count of a text (None: none here)
        self.context = context
        self._count_timer: Timer | None = None

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(
                "Prompt: ctrl+s starts it, Enter adds a line, ctrl+a selects all (type or paste to replace it), "
                "ctrl+l clears, Escape keeps the current journey"
            )
            yield TextArea(self.prompt, id="prompt-input", soft_wrap=True, show_line_numbers=False)
            yield Label("", id="prompt-count", classes="dim")
            if self.can_chat:
                yield OnOffBox("chat: a user message through the model's chat template", self.chat, id="chat")
            else:
                yield Label("plain text to continue (this model has no chat template)", classes="dim")

    def on_mount(self) -> None:
        self.query_one(TextArea).focus()
        self._count_later()

    @on(TextArea.Changed)
    def _count_later(self) -> None:
        if self.count is None:
            return
        if self._count_timer is not None:
            self._count_timer.stop()
        self._count_timer = self.set_timer(self.COUNT_AFTER_S, lambda: self._count(self.query_one(TextArea).text))

    @work(thread=True, exclusive=True, group="count")
    def _count(self, text: str) -> None:
        """The text's token count, off the UI thread (an 11 KB paste takes the tokenizer milliseconds)."""
        assert self.count is not None
        n = self.count(text)
        if n is None:
            return
        line = f"{n:,} tokens" + (", and the chat template's when chat is on" if self.can_chat else "")
        if self.context is not None and n >= self.context:
            line += f": more than the {self.context:,} this model reads"
        self.app.call_from_thread(self._show_count, line)

    def _show_count(self, line: str) -> None:
        """(On the UI thread: the dialog may have closed while the tokenizer counted.)"""
        if self.is_mounted:
            self.query_one("#prompt-count", Label).update(line)

    def action_select_all(self) -> None:
        self.query_one(TextArea).select_all()

    def action_clear(self) -> None:
        self.query_one(TextArea).clear()

    def action_start(self) -> None:
        chat = self.can_chat and self.query_one("#chat", Checkbox).value
        self.dismiss(PromptChoice(self.query_one(TextArea).text, chat))

    def action_cancel(self) -> None:
        self.dismiss(None)


class AskScreen(Dialog[str | None]):
    """One line of text asked for: Enter gives it, Escape closes."""

    QUESTION: ClassVar[str]
    PLACEHOLDER: ClassVar[str]
    INPUT_ID: ClassVar[str]
    BINDINGS: ClassVar = [Binding("escape", "cancel", "cancel")]
    DEFAULT_CSS = """
    AskScreen { align: center middle; }
    AskScreen > Vertical { width: 80%; max-width: 100; height: auto; border: thick $primary;
                           background: $surface; padding: 1 2; }
    AskScreen Label { width: 100%; }  /* wrapped to the dialog: its syntax is never cut */
    AskScreen #ask-error { color: $error; text-style: bold; }
    """

    def __init__(self, check: Callable[[str], str | None] | None = None) -> None:
        """`check(text)`: the one line saying what is wrong with a typed text, or None; a text it refuses
        keeps the dialog open with the text as typed and the line under it (nothing typed is lost)."""
        super().__init__()
        self.check = check

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(Text(self.QUESTION))  # (plain text: "[mean]" is not markup)
            yield Input(placeholder=self.PLACEHOLDER, id=self.INPUT_ID)
            yield Label("", id="ask-error")

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        wrong = self.check(event.value) if self.check is not None and event.value else None
        if wrong is not None:
            self.query_one("#ask-error", Label).update(Text(wrong))  # Text: the line is never read as markup
            return
        self.dismiss(event.value or None)

    def action_cancel(self) -> None:
        self.dismiss(None)


class ContinueScreen(AskScreen):
    """A text of the user's own to force through the journey, token by token."""

    QUESTION = (
        "Continue with this text: each of its tokens is taken as a forced step at autoplay's pace, "
        "so you see how likely the model found each one. Enter starts, Escape closes; any move stops it."
    )
    PLACEHOLDER = " Paris, the capital of France"
    INPUT_ID = "continue-input"


class GrammarDialog(AskScreen):
    """The grammar the generated text must follow: set, changed or cleared."""

    QUESTION = (
        "The grammar the text must follow (a sampling stage): json-schema FILE, regex PATTERN or grammar FILE "
        "(EBNF, GBNF or Lark); off clears it. Enter sets it, Escape closes."
    )
    PLACEHOLDER = "json-schema person.json"
    INPUT_ID = "grammar-input"

    def __init__(self, in_force: Grammar | None = None):
        super().__init__()
        self.in_force = in_force  # reopened, the dialog shows it and begins with it

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(Text(self.QUESTION))  # (plain text: "[mean]" is not markup)
            g = self.in_force
            yield Label(f"in force: {g.label}" if g else "in force: none", id="grammar-in-force", classes="dim")
            # Selected: Enter keeps it, typing replaces it ("off" clears), → edits it.
            yield Input(f"{g.kind} {g.source}" if g else "", placeholder=self.PLACEHOLDER, id=self.INPUT_ID)


class SettingsDialog(AskScreen):
    """Any sampling setting typed as NAME=VALUE (several apart by spaces)."""

    QUESTION = (
        "Type settings as NAME=VALUE, apart by spaces: temperature, top-k, top-p, min-p, repetition-penalty, "
        "presence-penalty, frequency-penalty, seed, max-new-tokens, stop (adds a stop string); preset=NAME sets a "
        "task's (factual, balanced, creative). Enter applies, Escape closes."
    )
    PLACEHOLDER = "temperature=0.3 top-k=0"
    INPUT_ID = "settings-input"


class InterventionsDialog(AskScreen):
    """The interventions listed, and one edit typed (see contract.interventions.edit_entries)."""

    QUESTION = (
        "Change the model while you watch: ablate L.H [mean], steer L:SCALE:TOWARD:AWAY, steer-tokens L:SCALE:A:B, "
        "patch L:POS:TEXT (or L:POS:branch N), sae-steer SAE:ID:STRENGTH or sae-clamp SAE:ID:VALUE; N turns entry "
        "N off or on, -N removes it, clear removes all. Enter applies, Escape closes."
    )
    PLACEHOLDER = "ablate 5.3"
    INPUT_ID = "interventions-input"

    def __init__(self, entries: Entries, begun: str = "", placeholder: str = PLACEHOLDER):
        super().__init__()
        self.placeholder = placeholder  # an engine without head ablation: a steering's example
        self.entries = entries
        self.begun = begun  # what the input starts with (a key for one kind of intervention)

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(Text(self.QUESTION))  # (plain text: "[mean]" is not markup)
            listed = [f"{n}. [{'on' if on else 'off'}] {i.label}" for n, (i, on) in enumerate(self.entries, 1)]
            yield Label(Text("\n".join(listed) or "none yet", style="" if listed else "dim"), id="interventions-list")
            yield Input(self.begun, placeholder=self.placeholder, id=self.INPUT_ID)

    def on_mount(self) -> None:
        super().on_mount()
        self.query_one(Input).action_end()  # typing goes on after what it was begun with


class SaeDialog(AskScreen):
    """A sparse autoencoder's folder to load beside the model."""

    QUESTION = (
        "A sparse autoencoder's folder (SAELens: cfg.json and sae_weights.safetensors; Gemma Scope 2: config.json "
        "and params.safetensors; sparsify: layers.N folders). F then shows its features at the cursor. Enter "
        "loads it, Escape closes."
    )
    PLACEHOLDER = "~/saes/smollm2-l20"
    INPUT_ID = "sae-input"


class CompareDialog(AskScreen):
    """B's settings for a comparison with this journey's (A's), on the same model."""

    QUESTION = (
        "Compare with other settings: this prompt runs twice side by side, A with the settings now and B "
        "with these changes (NAME=VALUE, separated by spaces; preset=creative for a task's). Enter starts, Escape "
        "closes."
    )
    PLACEHOLDER = "preset=creative"
    INPUT_ID = "compare-input"


class WatchScreen(Dialog[int | str | None]):
    """Choose a token to watch: from the candidates at the cursor, or typed (its text, or id:N).
    A watched token chosen again stops being watched."""

    BINDINGS: ClassVar = [Binding("escape", "cancel", "cancel")]
    DEFAULT_CSS = """
    WatchScreen { align: center middle; }
    WatchScreen > Vertical { width: 80%; max-width: 90; height: auto; max-height: 90%; border: thick $primary;
                             background: $surface; padding: 1 2; }
    WatchScreen OptionList { height: auto; max-height: 16; }
    WatchScreen Label { width: 100%; }
    """

    def __init__(self, candidates: list[tuple[int, str]], watched: list[tuple[int, str]]):
        super().__init__()
        self.candidates = candidates
        self.watched = watched

    def compose(self) -> ComposeResult:
        watched = {token for token, _ in self.watched}
        options = [
            Option(f"★ {visible(text)}  (id {token}): watched, choose to stop", id=str(token))
            for token, text in self.watched
        ]
        options += [
            Option(f"{rank}. {visible(text)}  (id {token})", id=str(token))
            for rank, (token, text) in enumerate(self.candidates, start=1)
            if token not in watched
        ]
        with Vertical():
            yield Label(
                "Watch a token at every step: type its text (with its leading space) or id:N, or an SAE's feature "
                "as feature:SAE:ID, then Enter"
            )
            yield Input(placeholder=" Paris   or   id:7042", id="watch-input")
            yield Label("or choose one of the candidates at the cursor (Tab, ↑ ↓, Enter); Escape closes")
            yield OptionList(*options, id="watch-options")

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.value:
            self.dismiss(event.value)

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(int(event.option.id or 0))

    def action_cancel(self) -> None:
        self.dismiss(None)


class LongJobScreen(Dialog[str | None]):
    """A job estimated to take long, said before it starts: run it anyway, or the cheaper choice."""

    BINDINGS: ClassVar = [Binding("escape", "cancel", "cancel")]
    DEFAULT_CSS = """
    LongJobScreen { align: center middle; }
    LongJobScreen > Vertical { width: 80%; max-width: 90; height: auto; border: thick $warning;
                               background: $surface; padding: 1 2; }
    LongJobScreen OptionList { height: auto; }
    LongJobScreen Label { width: 100%; }
    """

    def __init__(self, question: str, choices: list[tuple[str, str]]):
        super().__init__()
        self.question = question
        self.choices = choices  # (label, what dismiss gives)

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(Text(self.question))
            yield OptionList(*(Option(label, id=answer) for label, answer in self.choices), id="long-job-options")
            yield Label("↑ ↓ and Enter choose; Escape: neither, for now", classes="dim")

    def on_mount(self) -> None:
        self.query_one(OptionList).focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)

    def action_cancel(self) -> None:
        self.dismiss(None)
