"""The sampling pane's line for a token a server drew: the stages recomputed here over its top N are
an estimate, so a draw they cannot account for (outside their kept set) is said so, never "p 0"."""

from tokenviz.contract.records import Decision, Stage
from tokenviz.contract.settings import SamplingSettings
from tokenviz.ui.panes.sampling import decision_line


def drawn(chosen_prob: float) -> Decision:
    stage = Stage(name="top-p", detail="p=0.9", kept=16, mass=0.902, probs=(chosen_prob,))
    return Decision(
        mode="drawn", settings=SamplingSettings(temperature=1.5), watch=((7, "·Is"),), raw_probs=(0.005,),
        stages=(stage,), u=None, band=None, chosen_id=7, chosen_text="·Is", chosen_prob=chosen_prob,
        chosen_rank=21, raw_rank=21, raw_prob=0.005,
    )  # fmt: skip


def test_a_draw_the_recomputed_stages_cannot_account_for_is_said_so_never_p_0():
    line = decision_line(drawn(0.0))
    assert "the server drew ·Is (its rank 21, p 0.005" in line
    assert "p 0)" not in line and "top-N 0" not in line and "whole vocabulary" in line


def test_a_draw_within_the_recomputed_stages_gives_its_final_p_there():
    line = decision_line(drawn(0.031))
    assert "final p over its top-N 0.031" in line and "whole vocabulary" not in line


def test_the_short_form_at_80_columns_says_it_too():
    """At 80x24 the short form had dropped it: `server drew ·central · #21 p 0.002`, nothing said."""
    past, within = decision_line(drawn(0.0), width=60), decision_line(drawn(0.031), width=60)
    assert past.startswith("server drew ·Is · #21 p 0.005") and "past what the stages here keep" in past, past
    assert within.endswith("final p over top-N 0.031") and len(within) <= 60, within
