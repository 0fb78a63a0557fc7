"""Run by the SAE libraries' own environment (tests/sae_reference.py): `python reference_encode.py LIBRARY
FOLDER RESIDUALS.npy OUT.npy` writes the library's encode of the residuals with the SAE in FOLDER."""

import json
import sys
from pathlib import Path

import numpy as np
import torch


def main() -> None:
    library, folder, given, out = sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4]
    x = torch.from_numpy(np.load(given))
    with torch.no_grad():
        if library == "sae_lens":
            from sae_lens import SAE

            acts = SAE.load_from_disk(str(folder), device="cpu").encode(x)
        elif library == "gemma_scope":  # as SAELens's own Gemma Scope 2 loader maps its params
            from sae_lens import JumpReLUSAE, JumpReLUSAEConfig
            from safetensors.torch import load_file

            params = load_file(str(folder / "params.safetensors"))
            d_in, d_sae = params["w_enc"].shape
            assert json.loads((folder / "config.json").read_text())["architecture"] == "jump_relu"
            sae = JumpReLUSAE(JumpReLUSAEConfig(d_in=d_in, d_sae=d_sae, apply_b_dec_to_input=False))
            names = {"W_enc": "w_enc", "W_dec": "w_dec", "b_enc": "b_enc", "b_dec": "b_dec", "threshold": "threshold"}
            sae.load_state_dict({ours: params[theirs] for ours, theirs in names.items()})
            acts = sae.encode(x)
        elif library == "sparsify":
            from sparsify import SparseCoder

            top = SparseCoder.load_from_disk(folder).encode(x)
            acts = torch.zeros(x.shape[0], top.pre_acts.shape[-1]).scatter(-1, top.top_indices, top.top_acts)
        else:
            raise SystemExit(f"no library {library}")
    np.save(out, acts.float().numpy())


if __name__ == "__main__":
    main()
