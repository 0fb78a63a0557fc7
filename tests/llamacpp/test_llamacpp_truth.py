"""The llama.cpp backend's numbers are llama.cpp's own: each step's logits bit for bit and the greedy tokens
of llama-cpp-python's own public API (`Llama`) on the bundled GGUF, run outside tokenviz; a rewound step
gives the same logits again; and the options a GGUF cannot take are one line each."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from clitools import invoke
from llama_reference import (
    GPU_LAYERS,
    PROMPT,
    THREADS,
    engine_on,
    greedy_session,
    offloaded,
    offloaded_args,
    same_logits_as,
    softmax_of_queries_and_keys,
    trace,
)

pytestmark = [pytest.mark.llamacpp, pytest.mark.usefixtures("llama_cpp")]
# tokenviz's probabilities are torch's float32 softmax of llama.cpp's logits; against a float64 softmax of
# the same logits they differ by up to 1.7e-5 relative over the bundled model's 49,152 tokens (measured on
# this machine's CPU: torch's vectorised exp and sum follow the instructions the CPU has).
FLOAT32_SOFTMAX = 5e-5


def test_greedy_steps_are_llama_cpp_pythons_own_tokens_and_logits(monkeypatch, capsys, reference):
    doc = trace(monkeypatch, capsys, "--steps", "6", "--temperature", "0")
    chosen = [step["chosen"]["id"] for step in doc["steps"]]
    prompt = reference.tokenize(PROMPT.encode(), add_bos=True, special=True)
    assert [t["id"] for t in doc["prompt"]] == prompt
    reference.reset()
    completion = reference.create_completion(PROMPT, max_tokens=6, temperature=0)["choices"][0]["text"]
    assert doc["text"] == completion and len(chosen) == 6, (doc["text"], completion)
    reference.reset()
    reference.eval(prompt)  # (the same passes as the journey's: the prompt at once, then a token at a time)
    for i, step in enumerate(doc["steps"]):
        logits = np.asarray(reference.scores[len(prompt) - 1 + i], dtype=np.float32)
        shown = step["top"][:20]
        ids = [entry["id"] for entry in shown]
        assert [entry["logit"] for entry in shown] == logits[ids].tolist()  # bit for bit
        assert [entry["logit"] for entry in shown] == np.sort(logits)[::-1][:20].tolist()  # (ties in any order)
        probs = np.exp(logits.astype(np.float64) - logits.max())
        probs /= probs.sum()
        assert [entry["prob"] for entry in shown] == pytest.approx(probs[ids].tolist(), rel=FLOAT32_SOFTMAX)
        reference.eval([chosen[i]])
    from tokenviz.backends.llamacpp.runtime import placement_said

    assert doc["model"]["device"] == placement_said(GPU_LAYERS[0], doc["model"]["layers"])
    assert doc["model"]["dtype"] == "Q4_1"
    import llama_cpp

    assert doc["model"]["runtime"] == f"llama.cpp (llama-cpp-python {llama_cpp.__version__}), {THREADS} CPU threads"
    assert doc["model"]["covers"] == 0 and doc["model"]["requests"] == "" and doc["model"]["draws"] == ""


def test_the_model_view_on_llama_cpp_says_what_the_file_and_llama_cpp_hold(monkeypatch, capsys, reference):
    """M on llama.cpp said "embeddings input and output separate" for a GGUF with no output.weight (tied, as
    transformers' M says for the same file), "llama 256M Q4_1" (llama.cpp's size class) for a 135M model, and
    neither its threads nor its flash attention."""
    from tokenviz.files.gguf_header import read_gguf_header
    from tokenviz.system.paths import bundled_gguf

    model = trace(monkeypatch, capsys, "--steps", "1")["model"]
    assert "output.weight" not in read_gguf_header(bundled_gguf()).tensor_names and model["tied_embeddings"]
    import llama_cpp

    counted = llama_cpp.llama_model_n_params(reference.model)  # (llama-cpp-python's own count of the same file)
    assert (
        f"{counted / 1e6:,.0f}M parameters (counted)"
        in model["architecture"]
        == ("llama, 135M parameters (counted), in llama.cpp")
    )
    assert model["runtime"].endswith(f", {THREADS} CPU threads") and "flash attention auto" in model["attention"]


def test_flash_attention_off_gives_llama_cpp_pythons_flash_attn_false_numbers(monkeypatch, capsys):
    """--flash-attention off is llama-cpp-python's own Llama(flash_attn=False), bit for bit; llama.cpp's
    default (auto: on for a CPU) is Llama(flash_attn=True) (the test above); the two differ, and the model
    view says which ran."""
    from llama_reference import own_llama

    off = trace(monkeypatch, capsys, "--steps", "4", "--temperature", "0", "--flash-attention", "off")
    auto = trace(monkeypatch, capsys, "--steps", "4", "--temperature", "0")
    for reference in own_llama(flash_attn=False):
        same_logits_as(reference, off)
    assert off["model"]["attention"] == "llama.cpp's own, flash attention off"
    assert auto["model"]["attention"] == "llama.cpp's own, flash attention auto (llama.cpp's choice)"
    moved = max(
        abs(a["prob"] - b["prob"]) for x, y in zip(off["steps"], auto["steps"]) for a, b in zip(x["top"], y["top"])
        if a["id"] == b["id"]
    )  # fmt: skip
    assert moved > 1e-4, moved  # (flash attention sums in another order: 0.026 at most here, measured)


def test_compare_flash_attention_on_against_off_is_llama_cpp_pythons_own_on_each_side(monkeypatch, capsys):
    """`compare --against-option flash-attention=off`: B is A's GGUF with flash attention off (compare names
    no backend's option; B's backend takes it), each side's every step Llama(flash_attn=...)'s own bit for bit,
    the headers' differences naming the attention, the KL of their raw distributions above 0."""
    from llama_reference import own_llama

    args = ["compare", PROMPT, "--backend", "llama.cpp", *offloaded_args(), "--flash-attention", "on"]
    more = ["--against-option", "flash-attention=off", "--temperature", "0", "--steps", "4", "--json"]
    code, out, err = invoke(monkeypatch, capsys, *args, *more)
    assert code == 0, err
    doc = json.loads(out)
    for side, flash in (("a", True), ("b", False)):
        for reference in own_llama(flash_attn=flash):
            same_logits_as(reference, doc[side])
    on, off = "llama.cpp's own, flash attention on", "llama.cpp's own, flash attention off"
    assert doc["differences"] == {"attention": [on, off]}
    assert max(d["kl"] for d in doc["diff"]) > 0


@pytest.mark.parametrize("given", ["fast", "ON", ""])
def test_a_flash_attention_llama_cpp_does_not_take_is_one_line(monkeypatch, capsys, given):
    code, _, err = invoke(monkeypatch, capsys, "trace", "x", "--backend", "llama.cpp", "--flash-attention", given)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "give auto, on, off" in errors[0], err


def test_chat_is_the_ggufs_own_template_as_llama_cpp_python_formats_it(monkeypatch, capsys, reference):
    """--chat on a GGUF: the prompt's ids are those llama-cpp-python's own Jinja2ChatFormatter and
    tokenizer give for the GGUF's chat template; the user's words are marked as theirs, the rest as the
    template's; a greedy step is llama-cpp-python's own on those ids."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    question, system = "What is the capital of France?", "Answer in one word."
    metadata = reference.metadata
    bos, eos = (
        reference.detokenize([t], special=True).decode() for t in (reference.token_bos(), reference.token_eos())
    )
    formatter = Jinja2ChatFormatter(metadata["tokenizer.chat_template"], eos_token=eos, bos_token=bos)
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    prompt = formatter(messages=messages).prompt
    expected = reference.tokenize(prompt.encode(), add_bos=False, special=True)
    code, out, err = invoke(monkeypatch, capsys, "trace", question, "--backend", "llama.cpp", "--threads",
                            str(THREADS), "--chat", "--system", system, "--steps", "1", "--temperature", "0",
                            "--json")  # fmt: skip
    assert code == 0, err
    doc = json.loads(out)
    assert [t["id"] for t in doc["prompt"]] == expected and doc["model"]["chat_template"]
    reference.reset()
    reference.eval(expected)
    assert doc["steps"][0]["chosen"]["id"] == int(np.argmax(reference.scores[len(expected) - 1]))
    engine = engine_on()
    chat = engine.chat_ids(question, system)
    own = [i for i, marked in enumerate(chat.template) if not marked]
    assert chat.ids == expected and engine.decode([chat.ids[i] for i in own]) == system + question


def test_a_rewound_step_gives_the_same_logits_bit_for_bit(llama_cpp):
    import torch

    session = greedy_session(5)
    first = session.pending_logits.clone()
    session.rewind(3)
    for _ in range(3):
        session.step()
    assert torch.equal(session.pending_logits, first)
    assert session.engine.kv_len == len(session.ids) and session.engine.kv_bytes > 0


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--model", "weights.bin"], "runs a GGUF file (--model FILE.gguf)"),
        (["--device-map", "auto"], "--device-map is the transformers backend's"),
        (["--context", "0"], "--context 0: give a whole number from 1"),
        (["--endpoint", "http://127.0.0.1:9/v1"], "--endpoint is the server backend's option"),
        (["--ablate", "0.1"], "ablate L0.H1 (zero): a head of a GGUF in llama.cpp cannot be ablated here"),
        (["--steer-tokens", "0:4: Paris: the"], "llama.cpp's control vectors start after layer 1"),
        (["--steer-tokens", "30:4: Paris: the"], "the model's layers are 0-29"),
        (["--patch", "10:40:The dog"], "its source has positions 0-"),
    ],
)  # fmt: skip
def test_what_a_gguf_in_llama_cpp_cannot_take_is_one_line(monkeypatch, capsys, args, said):
    code, _, err = invoke(monkeypatch, capsys, "trace", PROMPT, "--backend", "llama.cpp", *args)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and said in errors[0] and "Traceback" not in err, err


def test_an_unknown_backend_is_one_line_naming_the_ones_here(monkeypatch, capsys):
    code, _, err = invoke(monkeypatch, capsys, "trace", PROMPT, "--backend", "gguf")
    assert code == 2 and "--backend 'gguf': the backends here are transformers, llama.cpp, server" in err, err


def test_the_lens_and_attention_rows_of_a_trace(monkeypatch, capsys):
    """The lens's last layer is the step's own distribution within 1e-3; each attention row sums to 1."""
    doc = trace(monkeypatch, capsys, "--steps", "3", "--temperature", "0", "--lens", "--attention", "20")
    for step in doc["steps"]:
        assert len(step["lens"]) == doc["model"]["layers"] + 1
        last = {entry["id"]: entry["prob"] for entry in step["lens"][-1]["top"]}
        for entry in step["top"][:3]:
            if entry["id"] in last:
                assert last[entry["id"]] == pytest.approx(entry["prob"], abs=1e-3)
        assert step["lens"][-1]["top"][0]["id"] == step["top"][0]["id"]
        sums = np.asarray(step["attention"]["heads"]).sum(-1)
        assert np.allclose(sums, 1.0, atol=1e-5), sums


def test_attention_rows_are_the_softmax_of_llama_cpps_own_queries_and_keys(llama_cpp):
    """The rows shown (llama.cpp's kq_soft_max) against softmax(QK^T / sqrt(d)) of the post-rotary queries
    and keys llama.cpp computed (captured from the same pass, rounded to float16 as its kernels multiply
    them: the KV cache keeps float16), within 1e-4."""
    import torch

    engine = engine_on()
    ids = engine.encode(PROMPT + " Paris, the capital of France.")
    rows, reference = softmax_of_queries_and_keys(engine, ids, 20, engine.info.head_dim**-0.5)
    assert (rows - reference).abs().max() < 1e-4
    assert torch.allclose(rows.sum(-1), torch.ones(engine.info.heads, len(ids), dtype=torch.float64), atol=1e-5)


def test_an_attention_pass_stops_when_a_key_waits_and_leaves_the_context_fit(llama_cpp):
    """UX 7's finding 7: a view's pass on llama.cpp stops between two of its graph's nodes once asked (its
    abort callback, set for that pass alone), raising Cancelled, long before the pass would end; the context
    is left fit to use: the next pass gives the rows of a pass never stopped, on another engine."""
    from tokenviz.contract.errors import Cancelled

    engine = engine_on()
    ids = engine.encode(" ".join([PROMPT] * 90))  # past one micro-batch of 512 tokens: several passes' worth
    rows, layers = range(len(ids) - 3, len(ids)), [0, engine.info.layers - 1]
    asked: list[int] = []
    engine.attention(ids, rows, layers, lambda: asked.append(1) is None and False)  # a whole pass's asks
    whole = len(asked)
    asked.clear()
    with pytest.raises(Cancelled):
        engine.attention(ids, rows, layers, lambda: asked.append(1) is None and len(asked) > 50)
    assert len(ids) > 512 and 50 < len(asked) < whole / 4, (len(asked), whole)
    again, fresh = engine.attention(ids, rows, layers), engine_on().attention(ids, rows, layers)
    assert float((again - fresh).abs().max()) < 1e-6


@pytest.mark.terminal
def test_the_app_steps_rewinds_branches_shows_the_lens_and_steers_llama_cpp_at_80x24():
    from terminals import keys, quits_cleanly, terminal, tmux, wait_screen, wait_until

    with terminal((80, 24), "--backend", "llama.cpp", *offloaded_args(), "--temperature", "0") as name:
        shown = wait_screen(name, r"·in@6 attends to: The 0\.\d+", timeout=120)  # (llama.cpp's own rows)
        assert "cpu (llama.cpp)" in shown and "Q4_1" in shown
        for generated in (1, 2):
            keys(name, "space")
            wait_screen(name, rf"{generated} generated")
        keys(name, "BSpace")
        wait_screen(name, r"1 generated")
        keys(name, "l")
        assert "emb ·the" in wait_screen(name, r"top-1 from L\d+", timeout=60)
        keys(name, "b")
        wait_screen(name, r"2 paths")
        keys(name, "I")  # a control vector, from the interventions dialog
        wait_screen(name, r"Change the model while you watch")
        tmux(name, "send-keys", "-t", name, "-l", "steer-tokens 15:8: Paris: the")
        keys(name, "Enter", "Escape")
        shown = wait_until(name, lambda text: "steer L15 ×8" in text and "Change the model" not in text, "steered")
        assert "error" not in shown.lower(), shown
        quits_cleanly(name)


@pytest.mark.bundled
def test_compare_puts_llama_cpp_beside_transformers_on_the_same_gguf(monkeypatch, capsys, reference):
    """The bundled GGUF as transformers dequantizes it (A) and as llama.cpp runs it (B): each step's KL,
    B's path llama-cpp-python's own greedy one, where their top-1s part (if they do: on one machine at step
    4, " Corée" and " Defense"; llama.cpp's kernels follow the CPU it was built for), and B forced along A's
    path after it."""
    args = ["compare", PROMPT, "--against-backend", "llama.cpp", *offloaded_args(), "--steps", "6"]
    code, out, err = invoke(monkeypatch, capsys, *args, "-t", "0", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert (doc["a"]["model"]["device"], doc["b"]["model"]["device"]) == ("cpu", "cpu (llama.cpp)")
    reference.reset()
    own = reference.create_completion(PROMPT, max_tokens=6, temperature=0)["choices"][0]["text"]
    assert doc["a"]["text"].startswith(" the Champ de la") and doc["b"]["text"] == own, (doc["b"]["text"], own)
    parted = next((i for i, d in enumerate(doc["diff"]) if not d["top1_agree"]), None)
    assert doc["parted_at"] == parted and (parted is None) == (doc["a"]["text"] == doc["b"]["text"])
    assert all(0 < d["kl"] < 0.1 for d in doc["diff"])  # (quantization's, not another model's)
    after = len(doc["diff"]) if parted is None else parted
    assert [d["teacher_forced"] for d in doc["diff"]] == [i > after for i in range(len(doc["diff"]))]
    code, _, err = invoke(monkeypatch, capsys, "compare", PROMPT, "--against-backend", "gguf", "--json")
    assert code == 2 and "--against-backend 'gguf': the backends here are" in err and "Traceback" not in err


def test_compare_two_ggufs_in_llama_cpp(tmp_path, monkeypatch, capsys):
    """Two GGUFs on the llama.cpp backend (here the same file twice): every step's KL is 0."""
    import os

    from tokenviz.system.paths import bundled_gguf

    other = tmp_path / "copy.gguf"
    os.symlink(bundled_gguf(), other)
    args = ["compare", PROMPT, "--backend", "llama.cpp", *offloaded_args(), "--against-model", str(other)]
    code, out, err = invoke(monkeypatch, capsys, *args, "--steps", "3", "-t", "0", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["b"]["model"]["name"] == "copy.gguf" and doc["parted_at"] is None
    assert all(d["kl"] == pytest.approx(0.0, abs=1e-9) and d["top1_agree"] for d in doc["diff"])


@pytest.mark.filterwarnings("ignore:llama_token_get_attr is deprecated:DeprecationWarning")  # (llguidance's call)
def test_a_grammar_stage_on_llama_cpp_takes_the_best_token_the_grammar_allows(monkeypatch, capsys, reference):
    """--regex on a GGUF in llama.cpp: llguidance reads llama.cpp's own vocabulary. Each greedy step is the
    argmax of llama.cpp's own logits (llama-cpp-python's Llama) over the tokens the grammar allows there, as
    llguidance itself masks them on that Llama's vocabulary, outside tokenviz; the text is the grammar's."""
    import re

    import llguidance
    import llguidance.llamacpp
    import llguidance.numpy

    pattern = " [0-9]{4}\\."
    doc = trace(monkeypatch, capsys, "--steps", "6", "--temperature", "0", "--regex", pattern)
    chosen = [step["chosen"]["id"] for step in doc["steps"]]
    assert re.fullmatch(pattern, doc["text"]), doc["text"]
    vocab = reference.n_vocab()
    tokenizer = llguidance.llamacpp.lltokenizer_from_vocab(reference._model.vocab, n_vocab=vocab)
    matcher = llguidance.LLMatcher(tokenizer, llguidance.grammar_from("regex", pattern), log_level=0)
    prompt = reference.tokenize(PROMPT.encode(), add_bos=True, special=True)
    reference.reset()
    reference.eval(prompt)
    for i, token in enumerate(chosen):
        mask = llguidance.numpy.allocate_token_bitmask(1, vocab)
        llguidance.numpy.fill_next_token_bitmask(matcher, mask)  # (llguidance's own mask, outside tokenviz)
        logits = np.asarray(reference.scores[len(prompt) - 1 + i], dtype=np.float32)[None].copy()
        llguidance.numpy.apply_token_bitmask_inplace(logits, mask)
        assert token == int(np.argmax(logits)), (i, token)
        assert matcher.consume_token(token)
        reference.eval([token])
    assert matcher.is_accepting()


def test_a_lens_of_some_rows_reads_those_layers_alone_and_gives_their_rows(llama_cpp):
    """A view that shows some rows of the lens (a short pane's, spread over the depth) has llama.cpp's
    callback copy out those layers' residuals alone (and the last layer's, the check), and gets the rows
    the whole lens gives at them."""
    from tokenviz.backends.llamacpp.plugin import BACKEND
    from tokenviz.contract.backend import Opening
    from tokenviz.contract.results import LensAsk
    from tokenviz.contract.settings import SamplingSettings
    from tokenviz.journey.session import Session

    settings = SamplingSettings(temperature=0)
    opening = Opening("trace", offloaded(), frozenset(), None, settings)
    session = Session(BACKEND.loader(opening)(lambda message, fraction: None), settings)
    session.start(PROMPT)
    session.step()
    layers = session.engine.info.layers
    position = len(session.ids) - 2
    ids, chosen = tuple(session.ids[: position + 1]), (session.ids[position + 1],)
    whole = session.engine.inspect(LensAsk(ids, (position,), chosen, (), None))[0]
    capture = session.engine.internals.capture
    read: list[set[str]] = []
    stop = capture.stop

    def recorded():
        found = stop()
        read.append(set(found))
        return found

    capture.stop = recorded
    rows = (0, 5, 17, layers)
    some = session.engine.inspect(LensAsk(ids, (position,), chosen, (), rows))[0]
    assert read == [{"l_out-4", "l_out-16", f"l_out-{layers - 1}", "result_norm"}]
    assert [row.layer for row in some.lens] == list(rows)
    for row in some.lens:
        same = whole.lens[row.layer]
        assert [t[0] for t in row.top] == [t[0] for t in same.top] and row.chosen_rank == same.chosen_rank
        assert row.chosen_prob == pytest.approx(same.chosen_prob, abs=1e-4)  # (a batch of one against many)
        assert row.residual_norm == pytest.approx(same.residual_norm, rel=1e-4)


def test_llama_cpp_computes_with_omp_num_threads_where_set_else_every_core(monkeypatch):
    from tokenviz.backends.llamacpp.runtime import Runtime, default_threads
    from tokenviz.system.paths import bundled_gguf

    cores = len(os.sched_getaffinity(0))  # (the cores this process may run on)
    for told, threads in (("1", 1), ("3", 3), ("", None), ("0", None), ("4,2", None), ("x", None)):
        monkeypatch.setenv("OMP_NUM_THREADS", told)
        assert default_threads() == (threads or cores), told
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert default_threads() == cores
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(allowed)})  # (a container or taskset giving it one core of the machine's)
    try:
        assert default_threads() == 1
    finally:
        os.sched_setaffinity(0, allowed)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    runtime = Runtime(bundled_gguf(), 256)  # (no threads given: the default reaches llama.cpp's context)
    try:
        assert runtime.lib.llama_n_threads(runtime.ctx) == runtime.lib.llama_n_threads_batch(runtime.ctx) == 3
    finally:
        runtime.close()


def test_replay_verify_says_when_flash_attention_differs_from_the_journeys(monkeypatch, capsys, tmp_path):
    """A journey keeps the flash attention it ran with (its model's attention); `replay --verify` run with
    another says so beside its verdict, and with the same says nothing of it."""
    saved = tmp_path / "journey.json"
    trace(monkeypatch, capsys, "--steps", "3", "--temperature", "0", "--flash-attention", "off", "--save", str(saved))
    verify = ["replay", str(saved), "--verify", "--backend", "llama.cpp", *offloaded_args()]
    code, out, err = invoke(monkeypatch, capsys, *verify, "--flash-attention", "off")
    assert code == 0 and "verified: all 3 steps" in out and "note: the journey ran as" not in err, out + err
    code, out, err = invoke(monkeypatch, capsys, *verify)
    said = " ".join(err.split())
    assert "note: the journey ran as llama.cpp, Q4_1, llama.cpp's own, flash attention off; verifying as " in said
    assert "flash attention auto (llama.cpp's choice)" in said, said


def test_every_piece_and_the_templates_metadata_are_llama_cpps_whole():
    """tokenviz reads a token's piece and a GGUF's metadata through llama.cpp's own functions with a buffer
    grown to fit, not llama-cpp-python's `_internals` (its `token_to_piece` keeps 32 bytes, padded with NULs,
    and gives none of a longer piece: 47 of the bundled vocabulary's; its `tokenize` allocates the training
    context's length a call). Each piece is llama_token_to_piece's whole answer with room to spare, and the
    chat template is the whole value."""
    import ctypes

    from tokenviz.backends.llamacpp.runtime import Runtime
    from tokenviz.system.paths import bundled_gguf

    runtime = Runtime(bundled_gguf(), 256)
    try:
        lib, room = runtime.lib, 1024
        buffer = ctypes.create_string_buffer(room)
        longest = 0
        for token in range(runtime.lib.llama_vocab_n_tokens(runtime.vocab_ptr)):
            n = lib.llama_token_to_piece(runtime.vocab_ptr, token, buffer, room, 0, True)
            assert 0 <= n < room and runtime.piece_bytes(token) == buffer.raw[:n], token
            longest = max(longest, n)
        assert longest > 32  # the bundled vocabulary has pieces longer than _internals keeps
        template = runtime.metadata("tokenizer.chat_template")
        assert template is not None and template.startswith("{% for message in messages %}") and template.endswith("%}")
    finally:
        runtime.close()
