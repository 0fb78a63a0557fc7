"""The trace and score documents as tables on the terminal (`tokenviz trace` and `tokenviz score`
without --json).

Model output and the prompt are plain text here, never Rich markup: a piece such as "[/]" prints as
typed. A beam or speculation document lists its output tokens (its own JSON holds the details).
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from tokenviz.contract.text import safe_text, shortened
from tokenviz.render.perplexity_figures import perplexity_figures
from tokenviz.render.visible import visible

RIGHT = ("step", "id", "p(final)", "rank", "u", "fwd ms", "request ms")
PIECE_CHARS = 40  # a piece shown in a table, at most (a token's is a few characters)
WIDE = 120  # below it (a piped 80 columns, say) the table keeps the columns that say what was chosen and why
NARROW_COLUMNS = ("step", "chosen", "id", "p(final)", "rank", "mode", "top 3 (raw softmax)")


def piece(text: str) -> str:
    """A token's piece as a table shows it: its invisible characters shown, and a piece longer than any
    token's cut (a 1 MB token, a hostile vocabulary's, made the table 66,698 lines; --json keeps it whole)."""
    return visible(shortened(text, PIECE_CHARS))


def precision(model: dict[str, Any]) -> str:
    """How the numbers are held: "float32", or "float32 · int8 weights" where the weights are quantized
    (the activations stay in the dtype)."""
    quantized = str(model.get("quantization") or "").split(" (")[0]  # "int8 weights (torchao …); …"
    return f"{model['dtype']} · {quantized}" if quantized and quantized != model["dtype"] else model["dtype"]


IN_JSON_ONLY = ("lens", "attention", "routing", "sae")  # what a step gains that the table does not show


def print_table(doc: dict[str, Any], console: Console) -> None:
    m = doc["model"]
    if m.get("covers"):  # a top N (a server's): what it gives, its shape where it is read
        shape = f" · {m['layers']} layers · {m['heads']} heads" if m["layers"] else ""
        header = f"{m['name']} · {m['device']}{shape} · {m['distribution']}"
    else:
        header = f"{m['name']} · {m['device']} · {precision(m)} · {m['layers']} layers · {m['heads']} heads"
    if m.get("compiled"):
        header += " · steps compiled"
    console.print(Text(safe_text(header), style="bold"))
    prompt = Text("prompt: ")
    for t in doc["prompt"]:  # each piece, then its id: "The 504  ·E 414"
        prompt.append(piece(t["text"]), style="cyan").append(f" {t['id']}", style="dim").append("  ")
    console.print(prompt)
    in_force = list(dict.fromkeys(label for step in doc["steps"] for label in step.get("interventions", ())))
    if in_force:  # the distributions below are the intervened model's: "KL from own" is the distance
        console.print(Text(safe_text("interventions in force: " + "; ".join(in_force)), style="bold"))
    if doc["steps"] and "draw" in doc["steps"][0]:
        console.print(_steps(doc["steps"], m, narrow=console.width < WIDE))
    else:
        console.print(
            Text("output: " + "  ".join(f"{piece(s['chosen']['text'])} {s['chosen']['id']}" for s in doc["steps"]))
        )
    kept = [name for name in IN_JSON_ONLY if doc["steps"] and name in doc["steps"][0]]
    if kept:  # asked for, and computed: never dropped without a word
        said = " and ".join(f"--{name}" for name in kept)
        console.print(Text(f"{said}: each step's, in the JSON document (--json); a table has no room", style="dim"))
    console.print(Text.assemble(("text: ", "bold"), safe_text(doc["full_text"])))
    if doc.get("stop_reason"):
        console.print(Text(f"stopped: {safe_text(doc['stop_reason'])}", style="dim"))
    for d in doc.get("diagnosis", ()):  # why the text looks as it does (journey.diagnosis)
        console.print(Text(f"why {d['symptom']}: {d['cause']}; {d['remedy']}", style="yellow"))


def _steps(steps: list[dict[str, Any]], model: dict[str, Any], narrow: bool = False) -> Table:
    """One row a step; `narrow` keeps NARROW_COLUMNS (and what was asked for: attribution, watch). The
    model's description says what the numbers are: a request's time (requests), a top N's probabilities."""
    table = Table(show_lines=False, header_style="bold")
    served = bool(model.get("requests"))
    took, timing = ("request", "request ms") if served else ("forward", "fwd ms")
    giver = model.get("numbers_of")
    top = (f"top 3 ({giver}'s)" if giver else "top 3 (its own top N)") if model.get("covers") else "top 3 (raw softmax)"
    columns = (
        "step",
        "chosen",
        "id",
        "p(final)",
        "rank",
        "mode",
        "u",
        top,
        "stages kept",
        timing,
        *(("grammar: allowed, mass removed",) if any(st["name"] == "grammar" for st in steps[0]["stages"]) else ()),
        *(("KL from own",) if "unsteered" in steps[0] else ()),
        *(("led most by (attribution)",) if "attribution" in steps[0] else ()),
        *(("watch: p raw/final #rank",) if "watch" in steps[0] else ()),
    )
    asked = (
        *((top, timing) if model.get("covers") or served else ()),
        "grammar: allowed, mass removed",
        "KL from own",
        "led most by (attribution)",
        "watch: p raw/final #rank",
    )
    shown = [c for c in columns if not narrow or c in NARROW_COLUMNS or c in asked]
    for col in shown:
        table.add_column(col, justify="right" if col in RIGHT else "left", overflow="fold")
    for s in steps:
        draw = s["draw"]
        cells = {
            "step": str(s["index"]),
            "chosen": Text(piece(s["chosen"]["text"])),
            "id": str(s["chosen"]["id"]),
            "p(final)": f"{s['chosen']['prob']:.3f}",
            "rank": str(draw["raw_rank"]),
            "mode": draw["mode"],
            "u": "" if draw["u"] is None else f"{draw['u']:.3f}",
            top: Text("  ".join(f"{piece(t['text'])} {t['prob']:.2f}" for t in s["top"][:3])),
            "stages kept": Text(" → ".join(f"{st['name']} {st['kept']}" for st in s["stages"]) or "—"),
            timing: f"{s['ms'][took]:.1f}",
        }
        grammar = next((st for st in s["stages"] if st["name"] == "grammar"), None)
        if grammar is not None:
            cells["grammar: allowed, mass removed"] = f"{grammar['allowed']:,}, {grammar['removed']:.1%}"
        if "unsteered" in s:
            saturated = " (saturated: every logit equal)" if s.get("saturated") else ""
            floor = "≥ " if s["unsteered"].get("kl_floor") else ""
            cells["KL from own"] = f"{floor}{s['unsteered']['kl']:.3f}{saturated}"
        if "attribution" in s:
            cells["led most by (attribution)"] = Text(_strongest(s["attribution"]))
        if "watch" in s:
            cells["watch: p raw/final #rank"] = Text(_watched(s["watch"]))
        table.add_row(*(cells[c] for c in shown))
    return table


def _watched(watch: list[dict[str, Any]]) -> str:
    return "  ".join(f"{piece(w['text'])} {w['prob']:.3f}/{w['final_prob']:.3f} #{w['rank']}" for w in watch)


def _strongest(attribution: list[dict[str, Any]], n: int = 3) -> str:
    """The n tokens with the largest attribution scores by size, signed."""
    strongest = sorted(attribution, key=lambda a: -abs(a["score"]))[:n]
    return "  ".join(f"{piece(a['text'])}@{a['position']} {a['score']:+.2f}" for a in strongest)


LOGPROB, ENTROPY = "logprob\n(nats)", "entropy\n(bits)"  # score's units, each under its column's name


def print_score(doc: dict[str, Any], console: Console) -> None:
    """One row per scored token, then the total log-probability and the perplexity."""
    from tokenviz.render.units import probability

    m = doc["model"]
    where = (
        f"{m['device']} (its top {m['covers']}: the entropy is a floor)"
        if m.get("covers")
        else f"{m['device']} · {precision(m)}"
    )
    console.print(Text(safe_text(f"{m['name']} · {where}"), style="bold"))
    first = doc["first"]
    console.print(Text(f"first token {piece(first['text'])} ({first['id']}) is read, not predicted", style="dim"))
    grammar = doc.get("grammar")
    table = Table(header_style="bold")
    numbers = ("#", "id", LOGPROB, "p", "rank", ENTROPY, "allowed", "in grammar")
    columns = ("#", "token", "id", LOGPROB, "p", "rank", ENTROPY, *(("allowed", "in grammar") if grammar else ()))
    for name in (*columns, "the model's top 3 there"):
        table.add_column(name, justify="right" if name in numbers else "left")
    for t in doc["tokens"]:
        top = "  ".join(f"{piece(c['text'])} {probability(c['prob'])}" for c in t["top"][:3])
        constrained = t.get("constrained")
        in_grammar = (f"{constrained['allowed']:,}", f"{constrained['logprob']:.3f}") if constrained else ("—", "—")
        table.add_row(
            str(t["index"]),
            Text(piece(t["text"]), style="dim" if t.get("template") else ""),
            str(t["id"]),
            f"{t['logprob']:.3f}",
            probability(t["prob"]),
            str(t["rank"]),
            f"{t['entropy']:.2f}" if t["entropy"] is not None else f"≥ {t['entropy_floor']:.2f}",
            *(in_grammar if grammar else ()),
            Text(top),
        )
    console.print(table)
    if grammar:
        console.print(
            Text(
                f"under the grammar ({safe_text(grammar['grammar'])}): log-probability {grammar['logprob']:.3f}"
                if grammar["logprob"] is not None
                else f"the text leaves the grammar ({safe_text(grammar['grammar'])}) at token {grammar['leaves_at']}",
                style="bold",
            )
        )
    template = doc.get("template") or {"tokens": 0}
    of_text = " of the text" if template["tokens"] else ""
    perplexity = "—" if doc["perplexity"] is None else f"{doc['perplexity']:.3f}"
    console.print(
        Text(
            f"total log-probability {doc['logprob']:.3f} nats over the {doc['scored']} tokens{of_text} · "
            f"perplexity {perplexity}",
            style="bold",
        )
    )
    if template["tokens"]:
        console.print(
            Text(
                f"the chat template's {template['tokens']} tokens (dimmed above) are not counted: "
                f"their log-probability is {template['logprob']:.3f}",
                style="dim",
            )
        )


def print_comparison(doc: dict[str, Any], console: Console) -> None:
    """compare without a terminal (or --json's table): per step each side's token, the KL, Δp, the rank each
    gives the other's choice and, where B is a server, its request time; where the paths part; the steps in
    llama-perplexity's terms, B the base."""
    a, b = doc["a"], doc["b"]
    served = bool(doc.get("kl_over"))  # (a served B's KL is over its top N)
    where = ("here", "on the server") if served else ("A", "B")
    b_side = f"{b['model']['name']} {b['model']['device']}"
    console.print(Text(safe_text(f"A {a['model']['name']} ({where[0]}) · B {b_side}"), style="bold"))
    table = Table(header_style="bold")
    kl = "KL bits (top-N)" if doc.get("kl_over") else "KL bits"
    timed = all(step.get("ms", {}).get("request") is not None for step in b["steps"])  # (a server's)
    names = (
        "step",
        "A chose",
        "B chose",
        kl,
        "Δp",
        "A's rank of B's",
        "B's rank of A's",
        *(("request ms",) if timed else ()),
    )
    for name in names:
        table.add_column(name, justify="left" if "chose" in name else "right")
    for s, a_step, b_step in zip(doc["diff"], a["steps"], b["steps"]):
        forced = "*" if s["teacher_forced"] else ""
        chose = (Text(piece(a_step["chosen"]["text"])), Text(piece(b_step["chosen"]["text"])))
        ranks = (f"{s['a_rank_of_b']}{forced}", f"{s['b_rank_of_a']}{forced}")
        dp = "—" if s.get("dp") is None else f"{s['dp']:+.1%}"
        request = (f"{b_step['ms']['request']:.1f}",) if timed else ()
        table.add_row(str(s["index"]), *chose, f"{s['kl']:.5f}{forced}", dp, *ranks, *request)
    differing = [f"{name} {pair[0]} {where[0]}, {pair[1]} {where[1]}" for name, pair in doc["differences"].items()]
    if differing:
        console.print(Text(safe_text("differs: " + " · ".join(differing)), style="bold"))
    console.print(table)
    parted = doc["parted_at"]
    said = "the paths never part" if parted is None else f"the paths part at step {parted}"
    if parted is not None and doc["independent_draws"]:
        said += (
            " (two independent draws, each side's own: not a difference between the models; the KL is; "
            "--temperature 0 compares their choices)"
        )
    console.print(Text(said + (f" · KL over {doc['kl_over']}" if doc.get("kl_over") else ""), style="dim"))
    if any(s["teacher_forced"] for s in doc["diff"]):
        more = " (one more request)" if served else " (B's model fed A's tokens)"
        console.print(Text(f"* after the paths part, B's figures are B's at A's context{more}", style="dim"))
    statistics = doc.get("statistics")
    if statistics:
        console.print(Text(f"as llama-perplexity, B the base: {perplexity_figures(statistics)}", style="dim"))


def print_against_base(doc: dict[str, Any], console: Console) -> None:
    """llama-perplexity's statistics after `--kl-divergence`, in its layout and precision, under a line on
    what was scored and a legend of what each figure is."""
    from tokenviz.contract.results import lens_row_label
    from tokenviz.decoding.perplexity_statistics import DP_PERCENTILES, KLD_PERCENTILES, percentile_key

    s, q, base = doc["statistics"], doc["model"], doc["base"]
    for side, m in (("Q", q), ("base", base)):
        console.print(Text(safe_text(f"{side}: {m['name']} · {m['device']} · {precision(m)}"), style="bold"))
    console.print(
        Text(
            f"{doc['windows']} windows of {doc['window']} tokens ({doc['tokens']:,} in the text, as the base "
            f"tokenizes it); the second half of each scored: {s['count']:,} tokens",
            style="dim",
        )
    )
    lines = ["====== Perplexity statistics ======"]
    lines.append(f"Mean PPL(Q)                   : {s['ppl_q']:10.6f} ± {s['ppl_q_unc']:10.6f}")
    lines.append(f"Mean PPL(base)                : {s['ppl_base']:10.6f} ± {s['ppl_base_unc']:10.6f}")
    if s["correlation"] is not None:
        lines.append(f"Cor(ln(PPL(Q)), ln(PPL(base))): {100 * s['correlation']:6.2f}%")
    lines.append(f"Mean ln(PPL(Q)/PPL(base))     : {s['ln_ppl_ratio']:10.6f} ± {s['ln_ppl_ratio_unc']:10.6f}")
    lines.append(f"Mean PPL(Q)/PPL(base)         : {s['ppl_ratio']:10.6f} ± {s['ppl_ratio_unc']:10.6f}")
    lines.append(f"Mean PPL(Q)-PPL(base)         : {s['ppl_diff']:10.6f} ± {s['ppl_diff_unc']:10.6f}")
    lines += ["", "====== KL divergence statistics ======"]
    if s["mean_kld"] is None:
        lines += [f"not given: {said}" for said in s.get("not_given", ())]
    else:
        lines.append(f"Mean    KLD: {s['mean_kld']:10.6f} ± {s['mean_kld_unc']:10.6f}")
        lines.append(f"Maximum KLD: {s['max_kld']:10.6f}")
        kld = [f"{100 * f:4.1f}%   KLD: {s[percentile_key('kld', f)]:10.6f}" for f in KLD_PERCENTILES]
        lines += [*kld[:4], f"Median  KLD: {s['median_kld']:10.6f}", *kld[4:]]
        lines.append(f"Minimum KLD: {s['min_kld']:10.6f}")
    lines += ["", "====== Token probability statistics ======"]
    lines.append(f"Mean    Δp: {100 * s['mean_dp']:6.3f} ± {100 * s['mean_dp_unc']:5.3f} %")
    lines.append(f"Maximum Δp: {100 * s['max_dp']:6.3f}%")
    dp = [f"{100 * f:4.1f}%   Δp: {100 * s[percentile_key('dp', f)]:6.3f}%" for f in DP_PERCENTILES]
    lines += [*dp[:5], f"Median  Δp: {100 * s['median_dp']:6.3f}%", *dp[5:]]
    lines.append(f"Minimum Δp: {100 * s['min_dp']:6.3f}%")
    lines.append(f"RMS Δp    : {100 * s['rms_dp']:6.3f} ± {100 * s['rms_dp_unc']:5.3f} %")
    lines.append(f"Same top p: {100 * s['same_top_p']:6.3f} ± {100 * s['same_top_p_unc']:5.3f} %")
    console.print(Text("\n".join(lines)))
    console.print(Text(LEGEND, style="dim"))
    tails = doc["tails"]
    by = "KLD" if tails["by_kld"] else "|Δp|"  # (no KLD: a side gave its top N only)
    table = Table(title=f"where they differ most, by {by}", header_style="bold", title_justify="left")
    for name in ("#", "after", "token", "KLD", "Δp", "parted from", "Q's top 3", "base's top 3"):
        table.add_column(name, justify="right" if name in ("#", "KLD", "Δp") else "left")
    for t in tails["by_kld"] or tails["by_dp"]:
        tops = ["  ".join(f"{piece(c['text'])} {c['prob']:.3f}" for c in t[side][:3]) for side in ("top", "base_top")]
        lens = t["lens"]
        parted = "—" if lens is None or lens["parted_from"] is None else lens_row_label(lens["parted_from"])
        figures = ("—" if t["kld"] is None else f"{t['kld']:.4f}", f"{t['dp']:+.3f}", parted)
        before = t["before"] if len(t["before"]) <= BEFORE_CHARS else "…" + t["before"][-BEFORE_CHARS:]
        table.add_row(str(t["index"]), Text(piece(before), style="dim"), piece(t["text"]), *figures, *tops)
    console.print(table)
    console.print(
        Text(f"the top-1s differ at {tails['changed_top_count']:,} of {s['count']:,} tokens (--json lists them)")
    )


BEFORE_CHARS = 20  # the text before a tail's token, its end kept (the words next to it)
LEGEND = (
    "KLD: KL(base || Q) at a token, over the tokens the base gives more than e^-16 · Δp: Q's probability of the "
    "text's next token minus the base's · Same top p: how often both put the most probability on one token · "
    "± : the standard error, as llama-perplexity gives it"
)
