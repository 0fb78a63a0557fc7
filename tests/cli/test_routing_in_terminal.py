"""The routing view in a real terminal (tmux) on a tiny random Mixtral, at a student's 80x24 and an
engineer's 200x60: each MoE layer's row for the token at the cursor, and the strip below."""

import pytest
from terminals import end, keys, start, wait_gone, wait_screen

pytestmark = pytest.mark.terminal

PROMPT = "The cat sat on the mat. The dog"


@pytest.fixture(scope="module")
def tiny_mixtral(tmp_path_factory) -> str:
    from families import family_model

    directory = tmp_path_factory.mktemp("tiny-mixtral")
    saved = family_model("mixtral")
    saved.model.save_pretrained(directory)
    saved.tokenizer.save_pretrained(directory)
    return str(directory)


@pytest.mark.parametrize("size", [(80, 24), (200, 60)])
def test_the_routing_view_in_a_real_terminal(tiny_mixtral, size):
    name = start(size, PROMPT, "--model", tiny_mixtral, "--temperature", "0")
    try:
        wait_screen(name, r"ready · step 0")
        keys(name, "Space", "Space")
        wait_screen(name, r"step 2 ")
        keys(name, "R")
        text = wait_screen(name, r"L3 +e\d")  # every MoE layer's row, down to the last
        for layer in range(4):
            assert f"L{layer} " in text
        assert "H " in text and "bits" in text
        if size == (200, 60):
            assert "top expert per layer" in text and "busiest: e" in text
        keys(name, "R")  # toggles back
        wait_gone(name, r"L3 +e\d")
    finally:
        end(name)
