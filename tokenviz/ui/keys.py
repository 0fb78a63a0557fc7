"""The key table: every key, what it does, its footer label and its command-palette entry.

One table of data. The app's bindings, the command palette, the help screen and the README's key
table are all generated from it (a test checks the README against `markdown_table()`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from textual.actions import parse
from textual.binding import Binding, BindingType

from tokenviz.contract.engine import Capability
from tokenviz.contract.presets import PRESETS
from tokenviz.contract.settings import PACES_S

PaletteCommand = tuple[str, str] | tuple[str, str, str]  # a command only the palette offers: (label, action[, owner])
PACE_LABELS = tuple("as fast as it runs" if p == 0 else f"a step every {p:g} s" for p in PACES_S)


@dataclass(frozen=True)
class Press:
    """One key and the action it runs (a Textual action string)."""

    key: str  # Textual's key name
    action: str
    footer: str = ""  # the footer's short label; empty: not shown in the footer
    palette: str = ""  # the command palette's entry; empty: none
    replay: bool = True  # works in a recorded journey (no model): the footer shows it there too
    needs: Capability | None = None  # what the engine must be able to do (see contract.engine); None: any engine
    # The pane that runs the action (its widget id): the key runs the pane's own action_NAME, routed by the
    # journey's screen (JourneyScreen.action_route), as Textual runs a widget's; "": the screen's own.
    owner: str = ""


@dataclass(frozen=True)
class KeyRow:
    """One row of the key table as a person reads it: one or more keys that belong together."""

    label: str  # how the table writes the keys
    does: str
    presses: tuple[Press, ...] = ()  # none: handled by Textual itself (the palette)


def _adjust(name: str, down: str, up: str, footer: str, said: str) -> tuple[Press, ...]:
    """A setting's two keys, each in the palette by the setting's name (`said`)."""
    return (
        Press(down, f"adjust('{name}', -1)", palette=f"{said} down ({down})", replay=False, owner="sampling"),
        Press(up, f"adjust('{name}', 1)", footer, f"{said} up ({up})", replay=False, owner="sampling"),
    )


KEYS: tuple[KeyRow, ...] = (
    KeyRow(
        "space, n",
        "step: take the pending token and run the model once more (with the KV cache)",
        (Press("space,n", "step", "step", "Step: take the pending token"),),
    ),
    KeyRow(
        "a",
        "autoplay on/off; it stops at end of text, max new tokens, a stop string or a full context",
        (Press("a", "autoplay", "play/pause", "Autoplay on/off", replay=False),),
    ),
    KeyRow(
        "backspace",
        "rewind one step (the cache is cropped; the state is exactly the one before)",
        (Press("backspace", "rewind", "rewind", "Rewind one step"),),
    ),
    KeyRow(
        "r",
        "back to the prompt, keeping its prefill (the path left is kept as a branch)",
        (Press("r", "reset", "reset", "Reset to the prompt"),),
    ),
    KeyRow(
        "e",
        "edit the prompt (a dialog; Enter prefills it, Escape keeps the journey)",
        (Press("e", "edit_prompt", "prompt", "Edit the prompt", replay=False, owner="tokens"),),
    ),
    KeyRow(
        "f",
        "continue with a text of your own: each of its tokens becomes a forced step, at autoplay's pace, so the "
        "panes show how likely the model found each one (u shades every chip by it); any move stops it",
        (Press("f", "continue_with", palette="Continue with this text (forced steps)", replay=False, owner="tokens"),),
    ),
    KeyRow("t / T", "temperature down / up by 0.1", _adjust("temperature", "t", "T", "temp±", "Temperature")),
    KeyRow(
        "k / K",
        "top-k down / up (off, 1, 2, 3, 5, 10, 20, 40, 50, 100, 200, 500, 1000)",
        _adjust("top_k", "k", "K", "top-k±", "Top-k"),
    ),
    KeyRow("p / P", "top-p down / up by 0.05", _adjust("top_p", "p", "P", "top-p±", "Top-p")),
    KeyRow(
        "F1 / F2 / F3",
        "a task's settings at once, as the source texts give them: "
        + "; ".join(f"{p.name} ({p.task}: {p.summary})" for p in PRESETS)
        + "; the sampling pane names the preset in force",
        tuple(
            Press(
                f"f{i}",
                f"adjust('{p.name}', 1)",
                palette=f"Preset: {p.name} (F{i}), for {p.task} ({p.summary})",  # its key, as every entry's
                replay=False,
                owner="sampling",
            )
            for i, p in enumerate(PRESETS, 1)
        ),
    ),
    KeyRow(
        "=",
        "type any setting as NAME=VALUE (a dialog: temperature=0.3 top-k=0 frequency-penalty=0.3 …; stop=TEXT adds a "
        "stop string)",
        (
            Press(
                "equals_sign",
                "assign",
                palette="Type a setting: NAME=VALUE (temperature, top-k, top-p, min-p, "
                "penalties, seed, max new tokens, stop)",
                replay=False,
                owner="sampling",
            ),
        ),
    ),
    KeyRow(
        "g",
        "greedy on/off (temperature 0, then back)",
        (Press("g", "adjust('greedy', 1)", "greedy", "Greedy on/off", replay=False, owner="sampling"),),
    ),
    KeyRow("s", "a new seed", (Press("s", "adjust('seed', 1)", "seed", "New seed", replay=False, owner="sampling"),)),
    KeyRow(
        "z",
        "ablate the head the attention map shows (its output set to zero); again to restore it; the model changes "
        "from here on and the pending token is re-decided",
        (
            Press(
                "z",
                "ablate_head",
                palette="Ablate the head in view (again: restore it)",
                replay=False,
                needs=Capability.ABLATION,
                owner="attention",
            ),
        ),
    ),
    KeyRow(
        "Y",
        "steer: the interventions dialog, begun with steer (L:SCALE:TOWARD:AWAY; steer-tokens for two tokens)",
        (
            Press(
                "Y",
                "interventions('steer ')",
                palette="Steer the residual stream",
                replay=False,
                needs=Capability.INTERVENTIONS,
            ),
        ),
    ),
    KeyRow(
        "J",
        "patch: the interventions dialog, begun with patch (L:POS:TEXT, another prompt's residual there, or "
        "L:POS:branch N, a branch's)",
        (
            Press(
                "J",
                "interventions('patch ')",
                palette="Patch the residual from another prompt",
                replay=False,
                needs=Capability.INTERVENTIONS,
            ),
        ),
    ),
    KeyRow(
        "I",
        "interventions (a dialog listing them): add ablate L.H [mean], steer L:SCALE:TOWARD:AWAY, steer-tokens "
        "L:SCALE:A:B, patch L:POS:TEXT, sae-steer SAE:ID:STRENGTH or sae-clamp SAE:ID:VALUE; N turns entry N off "
        "or on, -N removes it, clear; while any is on, the next-token pane adds the model's own probability and "
        "the KL from it",
        (
            Press(
                "I",
                "interventions('')",
                palette="Interventions: add, turn off or on, remove",
                replay=False,
                needs=Capability.INTERVENTIONS,
            ),
        ),
    ),
    KeyRow(
        "G",
        "the grammar the text must follow, a sampling stage (a dialog: json-schema FILE, regex PATTERN, grammar "
        "FILE for EBNF/GBNF/Lark, or off); set, changed or cleared live, the pending token re-decided at once",
        (
            Press(
                "G",
                "grammar",
                palette="Grammar: set, change or clear",
                replay=False,
                needs=Capability.GRAMMAR,
                owner="sampling",
            ),
        ),
    ),
    KeyRow(
        "- / +",
        "autoplay slower / faster: " + ", ".join(PACE_LABELS),
        (Press("minus", "pace(1)", replay=False), Press("plus", "pace(-1)", "pace", replay=False)),
    ),
    KeyRow(
        "[ / ]",
        "previous / next layer (with another view in the attention map's place, they bring the map back first)",
        (
            Press("left_square_bracket", "layer(-1)", needs=Capability.ATTENTION, owner="attention"),
            Press("right_square_bracket", "layer(1)", "layer±", needs=Capability.ATTENTION, owner="attention"),
        ),
    ),
    KeyRow(
        "h / H",
        "next / previous head (mean and max in the cycle; from another view, the map back first)",
        (
            Press("h", "head(1)", "head±", needs=Capability.ATTENTION, owner="attention"),
            Press("H", "head(-1)", needs=Capability.ATTENTION, owner="attention"),
        ),
    ),
    KeyRow(
        "1-9",
        "force the n-th candidate shown in the next-token pane instead of the sampled one; with the cursor on an "
        "earlier token, the tokens after it give way (a branch: the old path is kept)",
        tuple(Press(str(i), f"force({i})", replay=False, owner="next-token") for i in range(1, 10)),
    ),
    KeyRow(
        "← / →",
        "move the token cursor; the panes follow it (with the charts shown one at a time, change the chart)",
        (Press("left", "cursor(-1)"), Press("right", "cursor(1)")),
    ),
    KeyRow(
        "↑ ↓ PgUp PgDn Home End",
        "scroll the open view (lens, cache, beams, ...) when it is longer than its pane; with the attention map "
        "open they move the token cursor by a line or a page of the tokens pane, Home to the first token, End "
        "back to the newest",
        (
            Press("up", "scroll('line', -1)"),
            Press("down", "scroll('line', 1)"),
            Press("pageup", "scroll('page', -1)"),
            Press("pagedown", "scroll('page', 1)"),
            Press("home", "scroll('end', -1)"),
            Press("end", "scroll('end', 1)"),
        ),
    ),
    KeyRow(
        "u",
        "shade the chips by surprisal: how unexpected each token was to the model there (-log2 p in its raw "
        "distribution, the prompt's from the prefill; brighter is more surprising); again to turn it off",
        (Press("u", "toggle_surprisal", palette="Shade the tokens by surprisal", owner="tokens"),),
    ),
    KeyRow(
        "#",
        "show / hide the token ids in the tokens pane (the pieces alone, for a class)",
        (Press("number_sign", "toggle_ids", palette="Show / hide token ids", owner="tokens"),),
    ),
    KeyRow(
        "l",
        "logit lens view: each layer's top-3 guesses for the next token and the chosen token's rank, as many "
        "layers as the pane has room for, spread over the model's depth (--lens-layers chooses them); ★ where "
        "it becomes top-1 for good",
        (Press("l", "view('lens')", "lens", "View: logit lens", needs=Capability.LENS),),
    ),
    KeyRow(
        "R",
        "routing view (mixture-of-experts models): the experts each MoE layer's router chose for the token at the "
        "cursor, their weights and the router's entropy; a strip of each recent token's top expert per layer",
        (Press("R", "view('routing')", palette="View: expert routing", needs=Capability.ROUTING),),
    ),
    KeyRow(
        "m",
        "embedding and position view: the token's embedding row, the position scheme (learned or rotary), "
        "tied embeddings, the residual norm per layer",
        (Press("m", "view('embedding')", palette="View: embedding and position", needs=Capability.LENS),),
    ),
    KeyRow(
        "A",
        "attribution view: which earlier tokens led to the token after the cursor, strongest first, with the chips "
        "shaded by it; leave-one-out (exact, one forward pass per token) or, from the palette, gradient × input",
        (Press("A", "view('attribution')", palette="View: attribution", needs=Capability.LEAVE_ONE_OUT),),
    ),
    KeyRow(
        "w",
        "watch a token at every step: a candidate at the cursor, or typed (its text with its leading space, or id:N); "
        "up to 4; choosing a watched one stops watching it",
        (Press("w", "pin", palette="Watch a token", replay=False, owner="next-token"),),
    ),
    KeyRow(
        "W",
        "watch view: each watched token's raw and final probability over the steps and its rank; for two, why the "
        "model prefers one: their logit difference after the cursor split by layer (attention and MLP)",
        (Press("W", "view('watch')", palette="View: watched tokens"),),
    ),
    KeyRow(
        "F",
        "features view: what each sparse autoencoder loaded (--sae DIR, or E) reads in the residual at the cursor: "
        "its active features strongest first, each one's activation and share of the residual, L0 and the error",
        (Press("F", "view('features')", palette="View: SAE features", needs=Capability.RESIDUAL),),
    ),
    KeyRow(
        "E",
        "add a sparse autoencoder: a dialog for its folder (SAELens, Gemma Scope 2 or sparsify), checked against "
        "the model; steer or clamp one of its features with I (sae-steer, sae-clamp)",
        (Press("E", "add_sae", palette="Add an SAE (its folder)", replay=False, needs=Capability.RESIDUAL),),
    ),
    KeyRow(
        "D",
        "text view: the decoded text whole, wrapped and scrollable, the token at the cursor marked (the tokens "
        "pane's text line shows it up to the cursor)",
        (Press("D", "view('text')", palette="View: the whole decoded text"),),
    ),
    KeyRow(
        "y",
        "why the text looks as it does, once the journey stops: each symptom measured (cut off mid-sentence, "
        "repetitive, inconsistent), its cause, the evidence by position and the remedy the settings offer; what "
        "it cannot judge (a fact), and the steps where the model was least sure, each a link to go there",
        (Press("y", "view('why')", palette="View: why the text looks as it does"),),
    ),
    KeyRow(
        "C",
        "charts view: entropy and the chosen token's probability by step, the watched tokens' probability, the "
        "watched SAE features' activation, the prompt's surprisal, decode time against context length, the KV "
        "cache's size against tokens",
        (Press("C", "view('charts')", palette="View: charts"),),
    ),
    KeyRow(
        "c",
        "KV cache view: per layer heads × dims × tokens × bytes, bytes per token, growth, what the last rewind kept",
        (Press("c", "view('cache')", palette="View: KV cache", needs=Capability.CACHE),),
    ),
    KeyRow(
        "v",
        "verify: recompute the latest step without the cache and show the largest logit and attention differences",
        (
            Press(
                "v",
                "verify",
                palette="Verify the KV cache against a full recompute",
                replay=False,
                needs=Capability.CACHE,
                owner="cache",
            ),
        ),
    ),
    KeyRow(
        "i",
        "timing view: the last step's whole time and its parts, prefill against per-step decode, tokens/s, a "
        "sparkline of the last steps, the lens's own cost",
        (Press("i", "view('timing')", palette="View: timing"),),
    ),
    KeyRow(
        "b",
        "branch tree: every path from the prompt with its log-probability and mean entropy, two side by side",
        (Press("b", "view('branches')", palette="View: branch tree"),),
    ),
    KeyRow(
        "< / >, o",
        "select a branch, switch to it (the cache is rebuilt from the shared prefix); outside the branch tree, o "
        "opens it first",
        (
            Press("less_than_sign", "select_branch(-1)", owner="branches"),
            Press("greater_than_sign", "select_branch(1)", owner="branches"),
            Press("o", "open_branch", palette="Switch to the selected branch", replay=False, owner="branches"),
        ),
    ),
    KeyRow(
        "B",
        "beam search (width 3, 2-8 from the palette) from the current tokens: every beam's candidates, "
        "kept, finished or pruned",
        (Press("B", "beams", replay=False, needs=Capability.CACHE, owner="beams"),),
    ),
    KeyRow(
        "S",
        "speculative decoding from the current tokens (the model's own middle layer drafts where the runtime "
        "can, else prompt lookup, which the palette also offers): drafts, accepted, replaced",
        (
            Press(
                "S",
                "speculate",
                palette="Speculative decoding: the runtime's default drafter",
                replay=False,
                needs=Capability.CACHE,
                owner="speculation",
            ),
        ),
    ),
    KeyRow(
        "x",
        "export the journey as replayable JSON, a self-contained HTML page (any browser opens it, offline) and an "
        "SVG screenshot, in the current directory",
        (Press("x", "export", "export", "Export the journey (JSON and HTML) and a screenshot (SVG)"),),
    ),
    KeyRow(
        "escape",
        "cancel the long job running (prefill, attribution, beams, speculation, verify, watching, the logit split) "
        "and any asked for before it; the journey stays as it was and the view says how to run it again",
        (Press("escape", "cancel", replay=False),),
    ),
    KeyRow(
        "M",
        "model info view: architecture, layers, heads and KV heads, context, positions, attention, device, dtype",
        (Press("M", "view('model')", palette="View: model info"),),
    ),
    KeyRow("?", "help: what each pane shows", (Press("question_mark", "help", "help", "Help: what each pane shows"),)),
    KeyRow("ctrl+p", "command palette: every command above in this order, the palette-only ones, and the theme picker"),
    KeyRow("q, ctrl+c", "quit (also mid-step)", (Press("q", "quit", "quit"), Press("ctrl+c", "quit"))),
)

# Commands with no key of their own: the palette alone reaches them.
PALETTE_ONLY: tuple[PaletteCommand, ...] = (
    ("Min-p up", "adjust('min_p', 1)"),
    ("Min-p down", "adjust('min_p', -1)"),
    ("Repetition penalty up", "adjust('repetition_penalty', 1)"),
    ("Repetition penalty down", "adjust('repetition_penalty', -1)"),
    *((f"Beam search, width {w}", f"beams({w})") for w in range(2, 9)),
    ("Speculative decoding: prompt lookup", "speculate('prompt-lookup')"),
    ("Attribution by gradient × input (one backward pass)", "attribution('grad')", "attribution"),
    ("Attribution by leave-one-out (exact)", "attribution('loo')", "attribution"),
    ("Compare with other settings, side by side, on this model", "compare", "sampling"),
    ("Export an SVG screenshot", "export_svg"),
    ("Theme: choose a colour theme", "app.change_theme"),
)
# tokenviz compare: two journeys side by side, stepped together.
COMPARE_KEYS: tuple[KeyRow, ...] = (
    KeyRow("space, n", "both journeys take their next token", (Press("space,n", "step", "step", "Step both"),)),
    KeyRow(
        "a", "autoplay on/off: both step until both stop", (Press("a", "autoplay", "play/pause", "Autoplay on/off"),)
    ),
    KeyRow("backspace", "rewind both one step", (Press("backspace", "rewind", "rewind", "Rewind both one step"),)),
    KeyRow("r", "both back to the prompt", (Press("r", "reset", "reset", "Reset both to the prompt"),)),
    KeyRow(
        "- / +",
        "autoplay slower / faster: " + ", ".join(PACE_LABELS),
        (Press("minus", "pace(1)"), Press("plus", "pace(-1)", "pace")),
    ),
    KeyRow(
        "← / →",
        "move the token cursor in both; the panes follow it",
        (Press("left", "cursor(-1)"), Press("right", "cursor(1)")),
    ),
    KeyRow(
        "Home / End",
        "the cursor to the first step / back to the newest; the rows below follow it",
        (Press("home", "cursor_end(True)"), Press("end", "cursor_end(False)")),
    ),
    KeyRow(
        "p / P",
        "the cursor to the next / previous step where the two top-1s differ (▲ under the KL chart)",
        (
            Press("p", "parting(True)", "parting", "Next step where the top-1s differ"),
            Press("P", "parting(False)", palette="Previous step where the top-1s differ"),
        ),
    ),
    KeyRow(
        "x",
        "save both journeys (replayable, NAME-a.json and NAME-b.json), the comparison (NAME.json) and a "
        "screenshot (NAME.svg) here",
        (Press("x", "export", "export", "Export both journeys and the comparison"),),
    ),
    KeyRow(
        "escape",
        "back to the journey, when the comparison was opened from the app's palette",
        (Press("escape", "back", "back", "Back to the journey"),),
    ),
    KeyRow("?", "help: what the two sides and the figures below them show", (Press("question_mark", "help", "help"),)),
    KeyRow("ctrl+p", "command palette: every command above, an SVG screenshot and the theme picker"),
    KeyRow("q, ctrl+c", "quit", (Press("q", "quit", "quit"), Press("ctrl+c", "quit"))),
)
COMPARE_PALETTE_ONLY: tuple[PaletteCommand, ...] = (
    ("Export an SVG screenshot", "export_svg"),
    ("Theme: choose a colour theme", "app.change_theme"),
)
FOOTER_FIRST = ("quit", "help")  # the footer is cut at the right on a narrow terminal: these never are


def owners_of(rows: tuple[KeyRow, ...], palette_only: tuple[PaletteCommand, ...] = ()) -> dict[str, str]:
    """The pane that owns each action of a key table and its palette-only commands, by the action's name
    (as each entry says: Press.owner, a palette command's third field)."""
    owned = {p.action.split("(")[0]: p.owner for row in rows for p in row.presses if p.owner}
    return owned | {entry[1].split("(")[0]: entry[2] for entry in palette_only if len(entry) == 3}


def routed(action: str, owners: Mapping[str, str]) -> str:
    """`action` as its screen runs it: through `route` to the pane that owns it (Press.owner), or
    as it is."""
    owner = owners.get(action.split("(")[0])
    return f"route({owner!r}, {action!r})" if owner else action


def unrouted(action: str) -> str:
    """The action a routed one runs (see routed); any other as it is."""
    if not action.startswith("route("):
        return action
    return str(parse(action)[2][1])


def bindings(rows: tuple[KeyRow, ...] = KEYS, owners: Mapping[str, str] | None = None) -> list[BindingType]:
    """An app's BINDINGS in the footer's order: quit and help first, then the table's order; each action
    routed to the pane in `owners` that owns it."""
    pairs = [(row, p) for row in rows for p in row.presses]
    first = [(row, p) for name in FOOTER_FIRST for row, p in pairs if p.action == name and p.footer]
    rest = [pair for pair in pairs if pair not in first]
    return [
        Binding(p.key, routed(p.action, owners or {}), p.footer or p.palette or row.label, show=bool(p.footer))
        for row, p in first + rest
    ]


def key_of(action: str, rows: tuple[KeyRow, ...] = KEYS) -> str:
    """The key that runs `action` (by name, as "beams" or "view('attribution')"), as a note names it."""
    return next(p.key.split(",")[0] for row in rows for p in row.presses if p.action == action)


def model_actions() -> set[str]:
    """The actions (by name) that need the model: a recording turns their keys off."""
    return {p.action.split("(")[0] for row in KEYS for p in row.presses if not p.replay}


def needs_of(action: str, rows: tuple[KeyRow, ...] = KEYS) -> Capability | None:
    """The engine capability `action` (a key's or the palette's action string) needs, or None. A
    palette action with its own arguments ("beams(5)", "attribution('grad')") needs what its name does."""
    needs = {p.action: p.needs for row in rows for p in row.presses}
    if action in needs:
        return needs[action]
    name = action.split("(")[0]
    by_name = {a.split("(")[0]: n for a, n in needs.items() if n and not a.startswith("view(")}
    if name == "attribution":  # gradient × input needs the weights; leave-one-out, a context scored
        return Capability.ATTRIBUTION if "grad" in action else Capability.LEAVE_ONE_OUT
    return by_name.get(name)


def model_keys() -> set[str]:
    """The keys (Textual's names) whose actions need the model: a recording says so when one is pressed."""
    return {key for row in KEYS for p in row.presses if not p.replay for key in p.key.split(",")}


def palette_entries(
    rows: tuple[KeyRow, ...] = KEYS,
    palette_only: tuple[PaletteCommand, ...] = PALETTE_ONLY,
    owners: Mapping[str, str] | None = None,
) -> list[tuple[str, str]]:
    """(label, action) for every command a screen's palette offers, keyed ones first; each action routed
    to the pane in `owners` that owns it."""
    keyed = [(p.palette, p.action) for row in rows for p in row.presses if p.palette]
    listed = [(entry[0], entry[1]) for entry in palette_only]
    return [(label, routed(action, owners or {})) for label, action in keyed + listed]


def markdown_table(rows: tuple[KeyRow, ...] = KEYS) -> str:
    """A key table as Markdown: the help screen shows it and the README carries it verbatim."""
    lines = ["| key | does |", "|---|---|"]
    lines += [f"| {row.label} | {row.does} |" for row in rows]
    return "\n".join(lines)


JOURNEY_OWNERS = owners_of(KEYS, PALETTE_ONLY)  # read from the entries: no table of its own
