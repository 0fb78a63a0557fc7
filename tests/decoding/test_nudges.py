"""The settings keys' ladder: each press moves one notch, within the valid range."""

from tokenviz.contract.settings import SamplingSettings
from tokenviz.decoding.nudges import TOP_K_LADDER, adjust


def test_temperature_moves_by_a_tenth_and_stays_positive():
    s = SamplingSettings(temperature=0.7)
    assert adjust(s, "temperature", 1).temperature == 0.8
    assert adjust(s, "temperature", -1).temperature == 0.6
    low = SamplingSettings(temperature=0.1)
    assert adjust(low, "temperature", -1).temperature == 0.1  # greedy is its own key
    assert adjust(SamplingSettings(temperature=5.0), "temperature", 1).temperature == 5.0


def test_greedy_toggles_and_restores():
    s = SamplingSettings(temperature=0.9)
    greedy = adjust(s, "greedy", restore_temperature=0.9)
    assert greedy.greedy
    assert adjust(greedy, "greedy", restore_temperature=0.9).temperature == 0.9
    assert adjust(greedy, "temperature", 1).temperature == 0.1


def test_top_k_and_top_p_ladders():
    s = SamplingSettings(top_k=50, top_p=0.9)
    assert adjust(s, "top_k", 1).top_k == 100 and adjust(s, "top_k", -1).top_k == 40
    assert adjust(SamplingSettings(top_k=0), "top_k", -1).top_k == 0
    assert adjust(SamplingSettings(top_k=1000), "top_k", 1).top_k == 1000
    assert adjust(SamplingSettings(top_k=7), "top_k", 1).top_k == 10  # off-ladder values snap on
    assert TOP_K_LADDER[0] == 0
    assert adjust(s, "top_p", 1).top_p == 0.95 and adjust(s, "top_p", -1).top_p == 0.85
    assert adjust(SamplingSettings(top_p=1.0), "top_p", 1).top_p == 1.0
    assert adjust(SamplingSettings(top_p=0.05), "top_p", -1).top_p == 0.05


def test_seed_changes_deterministically():
    s = SamplingSettings(seed=0)
    assert adjust(s, "seed").seed != 0
    assert adjust(s, "seed").seed == adjust(s, "seed").seed
    assert 0 <= adjust(SamplingSettings(seed=2**62), "seed").seed < 100_000
    seen, seed = set(), SamplingSettings(seed=0)
    for _ in range(50):  # short seeds, each new one different from the last
        nxt = adjust(seed, "seed")
        assert nxt.seed != seed.seed and len(str(nxt.seed)) <= 5
        seen.add(nxt.seed)
        seed = nxt
    assert len(seen) > 40


def test_greedy_off_returns_to_the_temperature_before_it_even_after_other_nudges():
    from tokenviz.decoding.nudges import Nudges

    nudges, s = Nudges(SamplingSettings(temperature=0.7)), SamplingSettings(temperature=0.7)
    s = nudges.apply(s, "temperature", 1)  # 0.8
    s = nudges.apply(s, "greedy")
    assert s.greedy
    s = nudges.apply(s, "top_k", 1)  # a nudge while greedy does not forget the warm temperature
    assert nudges.apply(s, "greedy").temperature == 0.8
    assert Nudges(SamplingSettings(temperature=0)).apply(SamplingSettings(temperature=0), "greedy").temperature > 0
