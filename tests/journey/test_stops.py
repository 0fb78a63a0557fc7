"""Stop strings are searched for in the new text only (journey.stops.StopSearch), and find what searching
the whole generated text finds, at the same step."""

from hypothesis import given, settings
from hypothesis import strategies as st

from tokenviz.backends.transformers.runner import ModelRunner
from tokenviz.contract.settings import SamplingSettings
from tokenviz.journey.decoded_text import ADVANCE
from tokenviz.journey.session import Session
from tokenviz.journey.stops import StopSearch

LETTERS = st.text(alphabet="abc ", max_size=12)


STOPS = st.lists(st.text(alphabet="abc ", min_size=1, max_size=4), max_size=3)


@settings(max_examples=300, deadline=None)
@given(stops=STOPS, calls=st.lists(st.tuples(st.booleans(), LETTERS, st.none() | STOPS), max_size=30))
def test_the_new_text_search_finds_what_a_whole_search_finds(stops, calls):
    """Each call: the text grown by a few characters (or rewritten); the stop strings kept or changed."""
    search, text = StopSearch(), ""
    for grows, chunk, changed in calls:
        text, stops = text + chunk if grows else chunk, stops if changed is None else changed
        whole = next((stop for stop in stops if stop in text), None)
        assert search.first(stops, text) == whole, (stops, text)


def test_a_stop_string_across_tokens_stops_the_journey_at_the_step_a_whole_search_does(tiny_llama):
    sampled = SamplingSettings(seed=3, max_new_tokens=3 * ADVANCE)
    free = Session(ModelRunner(tiny_llama), sampled)
    free.start("The cat sat on the mat.")
    texts = [free.generated_text]
    while free.step() is not None:
        texts.append(free.generated_text)
    # A stop string first whole past the decoded text's first anchor, begun in the text before its step.
    step, stop = next(
        (k, texts[k][start : start + 4])
        for k in range(ADVANCE + 2, len(texts))
        for start in range(max(len(texts[k - 1]) - 3, 0), len(texts[k - 1]))
        if len(texts[k]) >= start + 4 and texts[k][start : start + 4] not in texts[k - 1]
    )
    stopped = Session(ModelRunner(tiny_llama), sampled.replace(stop=(stop,)))
    stopped.start("The cat sat on the mat.")
    while stopped.step() is not None:
        pass
    assert stopped.stop_reason == f"stop string {stop!r}" and len(stopped.generated_ids) == step
