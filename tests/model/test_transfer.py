"""One transfer to the host per step: packing, and a count of every read of a tensor's values.

On a GPU each read of a value waits for the device. Here, on the CPU, a TorchFunctionMode sees
every such read the engine makes, inside transformers' model and processors included.
"""

import collections
import math

import numpy as np
import pytest
import torch
from tiny import tiny_model
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from tokenviz.backends.transformers.runner import ModelRunner
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.settings import SamplingSettings
from tokenviz.decoding.sampling import decide, decide_on_device, summarise
from tokenviz.journey.session import Session
from tokenviz.tensors import transfer
from tokenviz.tensors.transfer import DeviceTimer, ids_to_device, to_host

PROMPT = "The cat sat on the mat"
# Calls that bring a tensor's values to the host, and calls whose output shape depends on values
# (the device must finish before the host knows the shape).
READS = {
    "tolist",
    "item",
    "__float__",
    "__int__",
    "__bool__",
    "__index__",
    "__array__",
    "numpy",
    "cpu",
    "nonzero",
    "masked_select",
    "unique",
    "repeat_interleave",
}
NUMBER_READS = ("tolist", "item", "__float__", "__int__", "__bool__", "__index__")  # each reads numbers
EVERY_STAGE = dict(
    temperature=0.8,
    top_k=30,
    top_p=0.9,
    min_p=0.01,
    repetition_penalty=1.2,
    presence_penalty=0.3,
    frequency_penalty=0.2,
)


class CountReads(TorchFunctionMode):
    """Reads seen where Python asks for them, and below: a tensor indexed by a one-number tensor
    (`probs[chosen]`) reads that number inside torch's C++, which only the dispatcher sees."""

    def __init__(self):
        super().__init__()
        self.reads = collections.Counter()
        self.below = ScalarReads(self.reads)

    def __enter__(self):
        self.below.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        super().__exit__(*exc)
        self.below.__exit__(*exc)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        if name in READS:
            self.reads[name] += 1
        elif name == "__getitem__" and any(
            isinstance(a, torch.Tensor) and a.dtype == torch.bool for a in _flat(args[1:])
        ):
            self.reads["boolean mask"] += 1
        return func(*args, **(kwargs or {}))


class ScalarReads(TorchDispatchMode):
    """Counts reads of one value that no Python call asked for (see CountReads)."""

    def __init__(self, reads: collections.Counter):
        super().__init__()
        self.reads, self.asked = reads, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            asked = sum(self.reads[name] for name in NUMBER_READS)
            if asked == self.asked:  # no Python-level read explains it
                self.reads["a number read inside torch"] += 1
            self.asked = asked
        return func(*args, **(kwargs or {}))


def _flat(items):
    for item in items:
        if isinstance(item, (tuple, list)):
            yield from _flat(item)
        else:
            yield item


ONE_TRANSFER = {"cpu": 1, "numpy": 1}


@pytest.fixture(autouse=True)
def as_on_a_gpu(monkeypatch):
    """The reads counted are a GPU's: on a CPU, whose reads wait for nothing, a step's ranking and summary
    read the logits with numpy instead, and to_host copies each part (tests/decoding/test_vocabulary_rows.py
    holds them to torch's)."""
    monkeypatch.setattr(transfer, "numpy_reads", lambda tensor: False)


def test_to_host_round_trips_every_dtype_and_shape():
    parts = {
        "half": torch.randn(3, 5, 7).half(),  # an odd byte count: the next part must stay aligned
        "float": torch.randn(2, 3),
        "double": torch.randn(4, dtype=torch.float64),
        "ids": torch.tensor([5, 1, 2**40]),
        "flag": torch.tensor([True, False, True]),
        "scalar": torch.tensor(3.25, dtype=torch.float64),
        "empty": torch.zeros(0, 4),
        "strided": torch.arange(12.0).reshape(3, 4).t(),
    }
    with CountReads() as counter:
        host = to_host(parts)
    assert dict(counter.reads) == ONE_TRANSFER
    assert list(host) == list(parts)
    for name, tensor in parts.items():
        assert host[name].dtype == tensor.numpy().dtype, name
        assert np.array_equal(host[name], tensor.numpy()), name


def reads(transfers: int, draws: int, device: torch.device) -> dict[str, int]:
    """What `transfers` transfers read, and `draws` sampled draws: on a CPU a draw also finds which
    tokens can be drawn (a read that waits for nothing there, so it sorts only those); on a GPU, nothing."""
    found = {"nonzero": draws} if draws and device.type == "cpu" else {}
    return {"cpu": transfers, "numpy": transfers, **found}


@pytest.mark.parametrize("settings", [EVERY_STAGE, dict(temperature=0, repetition_penalty=1.3), dict()])
def test_a_step_reads_the_device_once(tiny, settings):
    session = Session(ModelRunner(tiny), SamplingSettings(**settings))
    draws, device = int(not session.settings.greedy), tiny.model.device
    with CountReads() as counter:  # a model's first prefill also checks its output layer once (one more read)
        session.start(PROMPT)
    assert dict(counter.reads) == {**reads(1, draws, device), "__bool__": 1, "__float__": 1}
    with CountReads() as counter:
        session.start(PROMPT)
    assert dict(counter.reads) == reads(1, draws, device)
    for _ in range(3):
        with CountReads() as counter:
            session.step()
        assert dict(counter.reads) == reads(1, draws, device)
    with CountReads() as counter:
        session.take_rank(3)
    # forcing re-decides the pending step (one transfer, no draw), then steps (one more)
    assert dict(counter.reads) == reads(2, draws, device)


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_the_attention_view_reads_the_device_once(kind, device):
    """Rows computed on demand, from kept queries or by feeding their tokens again: one transfer."""
    session = Session(ModelRunner(tiny_model(kind, device=device)), SamplingSettings(seed=1))
    session.start(PROMPT)
    for _ in range(4):
        session.step()
    n = session.engine.kv_len
    with CountReads() as counter:
        session.attention(range(n - 5, n), [0])  # the newest rows: their queries are kept
    assert dict(counter.reads) == ONE_TRANSFER
    session.engine.rows.queries.clear()
    with CountReads() as counter:
        session.attention(range(0, 6), [0, 1])  # queries gone: fed again first
    assert dict(counter.reads) == ONE_TRANSFER


def test_a_settings_change_and_a_rewind_read_the_device_once_each(tiny_llama):
    session = Session(ModelRunner(tiny_llama), SamplingSettings(**EVERY_STAGE))
    session.start(PROMPT)
    for _ in range(4):
        session.step()
    device = tiny_llama.model.device
    with CountReads() as counter:
        session.set_settings(session.settings.replace(temperature=1.5, top_k=0))
    assert dict(counter.reads) == reads(1, 1, device)
    with CountReads() as counter:
        session.rewind(2)
    assert dict(counter.reads) == reads(1, 1, device)


def test_the_packed_decision_equals_the_values_read_one_by_one():
    """The record built from the one transfer holds the same numbers as direct reads."""
    torch.manual_seed(3)
    logits = torch.randn(300) * 3
    settings = SamplingSettings(**EVERY_STAGE, seed=5)
    context = [1, 2, 3, 2, 9]
    record = decide(logits, settings, context, context[2:], piece=str)
    raw = torch.softmax(logits, -1)
    assert record.raw_prob == pytest.approx(float(raw[record.chosen_id]), abs=1e-7)
    assert record.raw_rank == int((raw > raw[record.chosen_id]).sum()) + 1
    assert list(record.raw_probs) == pytest.approx([float(raw[i]) for i, _ in record.watch], abs=1e-7)
    assert len({i for i, _ in record.watch}) == len(record.watch)  # duplicates dropped on the host
    assert record.watch[0][0] == int(raw.argmax())
    assert record.band[0] <= record.u < record.band[1]


def _logits(case: str) -> torch.Tensor:
    torch.manual_seed(4)
    logits = torch.randn(300) * 3
    if case == "masked":  # a model's masked vocabulary, or a server's unknown rest
        logits[::3] = -math.inf
    if case == "tied":  # two largest logits, equal: the argmax is the first
        logits[[40, 7]] = logits.max() + 1
    return logits


@pytest.mark.parametrize("case", ["plain", "masked", "tied"])
def test_the_summary_and_a_greedy_decision_from_it_equal_the_values_read_one_by_one(case):
    """The summary ranks the logits (the softmax keeps their order) and hands the decision its largest;
    greedy's raw rank is 1 without a count: the argmax of the logits is the most probable token."""
    logits = _logits(case)
    summary = summarise(logits, 10)
    pending = decide_on_device(logits, SamplingSettings(temperature=0), [1, 2], [], summary=summary)
    host = to_host({**summary.tensors, **pending.tensors})
    top, entropy = summary.read(host, str)
    decision = pending.read(host, str)
    raw = torch.softmax(logits.double(), -1)
    assert [c.prob for c in top] == pytest.approx(sorted(raw.tolist(), reverse=True)[:10], rel=1e-5)
    assert [c.logit for c in top] == [float(logits[c.id]) for c in top]
    assert [c.logit for c in top] == sorted((c.logit for c in top), reverse=True)
    assert entropy == pytest.approx(float(torch.special.entr(raw).sum()) / math.log(2), abs=1e-5)  # bits
    assert decision.chosen_id == int(logits.argmax()) == (7 if case == "tied" else top[0].id)
    assert decision.raw_rank == int((raw > raw[decision.chosen_id]).sum()) + 1 == 1


def test_a_summary_of_logits_that_are_not_numbers_stops_the_decision():
    logits = _logits("plain")
    logits[5] = math.nan
    summary = summarise(logits, 10)
    pending = decide_on_device(logits, SamplingSettings(temperature=0), [1, 2], [], summary=summary)
    with pytest.raises(TokenvizError, match="not a number"):
        pending.read(to_host({**summary.tensors, **pending.tensors}), str)


def test_ids_reach_the_device_as_one_long_row():
    ids = ids_to_device((7, 0, 2**40), torch.device("cpu"))
    assert ids.dtype == torch.long and ids.shape == (1, 3) and ids.tolist() == [[7, 0, 2**40]]


def test_device_timer_measures_the_work_between_start_and_stop():
    timer = DeviceTimer(torch.device("cpu"))
    torch.randn(400, 400) @ torch.randn(400, 400)
    first = timer.stop().ms()
    assert 0 < first < 10_000
    assert timer.ms() == first


@pytest.mark.bundled
def test_the_bundled_model_step_reads_the_device_once(bundled):
    session = Session(ModelRunner(bundled), SamplingSettings(**EVERY_STAGE))
    session.start(PROMPT)
    with CountReads() as counter:
        session.step()
    assert dict(counter.reads) == reads(1, 1, bundled.model.device)


# Operators that only make a view (no kernel runs on a GPU), left out of the count below.
VIEWS = {
    "view", "_unsafe_view", "reshape", "detach", "alias", "lift_fresh", "as_strided", "expand", "slice", "select",
    "narrow", "split", "chunk", "unbind", "t", "transpose", "permute", "unsqueeze", "squeeze",
}  # fmt: skip
# Kernels a decode step launches beyond the model's own forward pass, measured on 2026-11-28 (torch
# 2.13, transformers 5.24; the tiny Llama): greedy 26, the app's default sampling 79, every stage 103
# (were 41, 136 and 220 before the summary's softmax and ranking served the decision, each stage's
# row was built in one piece and the kept tokens counted in one pass; 39, 124 and 196 before the
# summary's and the decision's numbers went as one part each, the scalars took one conversion, and
# the stages' rows were made together, as the rows of one tensor, in a few calls for any number of
# stages; 29, 80 and 104 before the summary's ranking gave the decision the largest logit and greedy's
# raw rank went uncounted). Each budget leaves about a sixth of room: another record built, a stage's
# row made on its own would pass it. On a GPU every one is a launch the host waits on.
STEP_KERNELS = {"greedy": 30, "default": 92, "every stage": 120}


class CountKernels(TorchDispatchMode):
    """Every operator torch dispatches that is not a view."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ not in VIEWS:
            self.count += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(
    "name, settings", [("greedy", dict(temperature=0)), ("default", dict()), ("every stage", EVERY_STAGE)]
)
def test_a_step_launches_few_kernels_beyond_the_models_own_pass(tiny_llama, name, settings):
    """A stand-in on the CPU for a GPU's launches: the kernels of one step (the forward pass, the
    summary, the decision, the record) less those of transformers' own forward over the same cache."""
    from transformers import DynamicCache

    session = Session(ModelRunner(tiny_llama), SamplingSettings(**settings))
    session.start(PROMPT)
    for _ in range(3):
        session.step()
    with CountKernels() as step:
        session.step()
    cache = DynamicCache()
    with torch.inference_mode():
        device = tiny_llama.model.device
        tiny_llama.model(torch.tensor([session.ids[:-1]], device=device), cache=cache, use_cache=True)
        with CountKernels() as bare:
            tiny_llama.model(torch.tensor([session.ids[-1:]], device=device), cache=cache, use_cache=True)
    beyond = step.count - bare.count
    assert 0 < beyond <= STEP_KERNELS[name], f"{name}: {beyond} kernels beyond the model's own pass"
