"""The cache reaches a model under the name its forward takes: transformers 5.24 renamed
`past_key_values` to `cache`, families not yet renamed keep the old name, and the old name goes in 5.40."""

import torch

from tests.tiny import tiny_model
from tokenviz.backends.transformers.cache import full_cache, passed_cache, with_cache


class OldName(torch.nn.Module):
    def forward(self, input_ids, past_key_values=None, use_cache=None):
        return past_key_values


class NewName(torch.nn.Module):
    def forward(self, input_ids, cache=None, use_cache=None):
        return cache


def test_each_forward_gets_the_cache_by_its_own_name():
    cache = full_cache()
    assert with_cache(OldName(), cache) == {"past_key_values": cache}
    assert with_cache(NewName(), cache) == {"cache": cache}
    assert OldName()(None, **with_cache(OldName(), cache)) is cache
    assert NewName()(None, **with_cache(NewName(), cache)) is cache


def test_a_hook_finds_the_cache_under_either_name_and_an_empty_one_counts():
    cache = full_cache()  # (empty: falsy as a sequence, still the cache)
    assert passed_cache({"cache": cache}) is cache
    assert passed_cache({"past_key_values": cache}) is cache
    assert passed_cache({"cache": None, "past_key_values": cache}) is cache
    assert passed_cache({"use_cache": True}) is None


def test_the_installed_transformers_fills_the_cache_it_is_given_without_a_warning(recwarn):
    loaded = tiny_model("llama")
    cache = full_cache()
    loaded.model(input_ids=torch.tensor([[1, 2, 3]]), **with_cache(loaded.model, cache), use_cache=True)
    assert cache.get_seq_length() == 3
    assert not [w for w in recwarn if "deprecated" in str(w.message)]
