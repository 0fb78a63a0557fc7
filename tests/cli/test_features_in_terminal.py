"""An SAE's features in a real terminal (tmux) at a student's 80x24, on the bundled model: `tokenviz --sae DIR`,
F shows the features at the cursor, w follows one (feature:SAE:ID), and the interventions dialog steers and
then clamps it live, the pending token re-decided beside the model's own."""

import pytest
from sae_folders import saelens_sae
from terminals import end, keys, start, type_into_field, wait_screen

pytestmark = [pytest.mark.terminal, pytest.mark.bundled, pytest.mark.features]

LAYER, HIDDEN = 20, 576  # the bundled SmolLM2-135M's residual after layer 20 of 30


def test_features_followed_steered_and_clamped_at_80x24(tmp_path):
    folder = saelens_sae(tmp_path / "sae-t", "topk", HIDDEN, 4, layer=LAYER)
    name = start((80, 24), "The Eiffel Tower is located in", "--temperature", "0", "--sae", str(folder))
    try:
        wait_screen(name, r"ready · step 0")
        keys(name, "F")
        text = wait_screen(name, rf"sae-t L{LAYER}\s+L0 \d+")
        assert "#" in text
        keys(name, "w")
        wait_screen(name, r"Watch a token")
        type_into_field(name, "feature:sae-t:3")
        keys(name, "Enter")
        wait_screen(name, r"★ sae-t#3")
        keys(name, "I")
        wait_screen(name, r"Change the model")
        type_into_field(name, "sae-steer sae-t:3:60")
        keys(name, "Enter")
        wait_screen(name, rf"steer L{LAYER} ×60 by sae-t#3")
        keys(name, "I")
        wait_screen(name, r"Change the model")
        type_into_field(name, "sae-clamp sae-t:3:0")
        keys(name, "Enter")
        wait_screen(name, r"2 interventions|clamp L20 =0")
        keys(name, "Space")
        wait_screen(name, r"step 1 ")
        assert "Traceback" not in wait_screen(name, r"★ sae-t#3")
    finally:
        end(name)
