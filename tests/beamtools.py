"""transformers' own beam search, as the beam tests compare with it."""

import torch


def generate_beams(loaded, ids, width, steps):
    with torch.inference_mode():
        out = loaded.model.generate(
            torch.tensor([ids]),
            num_beams=width,
            do_sample=False,
            max_new_tokens=steps,
            num_return_sequences=width,
            output_scores=True,
            return_dict_in_generate=True,
        )
    eos = loaded.model.generation_config.eos_token_id
    sequences = []
    for seq in out.sequences:
        generated = seq[len(ids) :].tolist()
        if eos in generated:  # generate() pads a finished beam out to the full length
            generated = generated[: generated.index(eos) + 1]
        sequences.append(generated)
    return sequences, out.sequences_scores.tolist()
