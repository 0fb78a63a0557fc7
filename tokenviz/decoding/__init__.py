"""Decoding: the sampling decision with every stage visible, beam search, speculative decoding,
and the nudges the settings keys apply."""
