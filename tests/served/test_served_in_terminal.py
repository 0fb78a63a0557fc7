"""The review's findings on a served model (issue 51, items 1, 3, 4 and 5) in a real terminal (tmux),
at each of its three people's sizes (80x24, 120x36, 200x60), against the real vLLM server."""

from __future__ import annotations

import re

import pytest
from terminals import at_each_size, keys, quits_cleanly, screen, wait_screen

pytestmark = [pytest.mark.served, pytest.mark.terminal]

KEY_ENV = "TOKENVIZ_REVIEW_KEY"
PROMPT = "The Eiffel Tower is located in"


def served(vllm_server, *args: str) -> tuple[str, ...]:
    return (*args, "--endpoint", vllm_server.url, "--api-key-env", KEY_ENV)


def test_a_served_models_status_footer_and_missing_keys(vllm_server):
    """Item 3: the status line says a request's time, never `fwd`, and no KV cache (never `0 B`). Item 4:
    the footer offers no key the server lacks, and such a key answers in one short line."""

    def check(name, size):
        wait_screen(name, r"ready · step 0", timeout=180)
        keys(name, "Space")
        lines = wait_screen(name, r"ready · step 1 ", timeout=60).splitlines()
        status, footer = lines[-2], lines[-1]
        assert " fwd " not in status and "KV " not in status and " 0 B" not in status, status
        assert "request " in status or size[0] < 200, status
        assert not re.search(r"layer±|head±|\blens\b|KV cache", footer), footer
        keys(name, "l")
        text = wait_screen(name, r"View: logit lens")
        said = text[text.index("View: logit lens") :].split("\n")[0]  # (the notification, at the bottom right)
        assert "(it gives:" not in said and "vllm-lens" not in said, said  # one short line, not five or six
        quits_cleanly(name)

    at_each_size(check, *served(vllm_server, PROMPT, "--temperature", "0"), env={KEY_ENV: vllm_server.key})


def test_a_draw_the_recomputed_stages_cannot_account_for_is_said_so(vllm_server):
    """Item 1: at temperature 1.5 the server drew tokens outside the kept set the stages recomputed here
    over its top 20, and the pane said `final p over its top-N 0`. Such a draw is said so, never p 0."""

    def check(name, size):
        wait_screen(name, r"ready · step 0", timeout=180)
        keys(name, "a")
        wait_screen(name, r"stopped: ", timeout=120)
        seen = []
        for _ in range(16):  # back along the journey until a step whose draw the stages cannot account for
            text = screen(name)
            seen.append(text)
            if "past what the stages" in text:
                break
            keys(name, "Left", pause=0.4)
        else:
            raise AssertionError("no draw past the recomputed stages in 16 steps at T 1.5:\n" + seen[-1])
        assert "top-N 0)" not in text and not re.search(r"final p[^\n]*\b0\)", text), text

    args = served(vllm_server, PROMPT, "--temperature", "1.5", "--seed", "3", "--max-new-tokens", "16")
    at_each_size(check, *args, env={KEY_ENV: vllm_server.key})


def test_compare_against_an_endpoint_opens_the_comparison_screen(vllm_server):
    """Item 5: `compare --against-backend server` printed a table and ended; it opens the comparison screen,
    whose KL column says it is over the server's top N."""

    def check(name, size):
        text = wait_screen(name, r"KL top-N", timeout=240)
        assert "how they differ" in text and "B: " in text, text
        keys(name, "Space")
        wait_screen(name, r"(?s)step.*\n.*\b1\b", timeout=60)
        quits_cleanly(name)

    args = ("compare", PROMPT, "--against-backend", "server", "--endpoint", vllm_server.url, "--api-key-env", KEY_ENV)
    at_each_size(check, *args, "--temperature", "0", "--steps", "4", env={KEY_ENV: vllm_server.key})


def test_a_served_chats_special_tokens_are_marked(vllm_server):
    """Item 4: a served model's special tokens read as plain `<|im_start|>`, not marked as on a local
    model. With its tokenizer here (--tokenizer DIR) they are chips of their own: ⟨<|im_start|>⟩."""
    from tokenviz.backends.transformers.gguf_cache import ensure_converted, gguf_cache_dir
    from tokenviz.system.paths import bundled_gguf

    directory = gguf_cache_dir(bundled_gguf())
    ensure_converted(bundled_gguf(), directory, lambda message, fraction: None)

    def check(name, size):
        text = wait_screen(name, r"ready · step 0", timeout=180)
        keys(name, "Home")  # (the first tokens: the template's opening)
        text = wait_screen(name, r"⟨<\|im_start\|>⟩")
        assert not re.search(r"(?<!⟨)<\|im_start\|>(?!⟩)", text.split("text:")[0]), text  # no chip unmarked
        quits_cleanly(name)

    args = served(vllm_server, "What is the capital of France?", "--chat", "--tokenizer", str(directory))
    at_each_size(check, *args, "--temperature", "0", env={KEY_ENV: vllm_server.key})
