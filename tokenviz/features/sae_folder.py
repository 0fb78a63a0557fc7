"""A sparse autoencoder read from a folder on disk (nothing is fetched), in the layout its library writes:

- SAELens: `cfg.json` (architecture standard, jumprelu, topk or gated; `hook_name`, at its top or in its
  `metadata`, such as `blocks.12.hook_resid_post`) and `sae_weights.safetensors` (W_enc, b_enc, W_dec,
  b_dec, and threshold, or b_gate, b_mag and r_mag);
- Gemma Scope 2: `config.json` (architecture jump_relu, `hf_hook_point_in` such as `model.layers.12.output`)
  and `params.safetensors` (w_enc, b_enc, w_dec, b_dec, threshold; the input without b_dec);
- sparsify: a folder per hook point, `layers.N` (`cfg.json` with k, and `sae.safetensors`: encoder.weight,
  encoder.bias, W_dec, b_dec), or the checkpoint above them: each hook point an SAE.

Each reads the residual after one decoder layer. The folder is read as untrusted input: its files regular
and bounded, the config's values of their kinds, each tensor's name, shape and dtype checked against the
config before a byte of it is read (safetensors_header), its values finite; a problem is one line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from tokenviz.contract.errors import ModelLoadError
from tokenviz.contract.text import safe_text
from tokenviz.features.feature_notes import notes_of
from tokenviz.features.sparse_autoencoder import ARCHITECTURES, SparseAutoencoder
from tokenviz.files.safetensors_header import TensorEntry, read_header
from tokenviz.system.reading import parse_json, read_file

CONFIG_BYTES = 1 << 20  # a config file past this is not an SAE's
MAX_FEATURES = 1 << 21  # Gemma Scope's widest is 1M
MAX_WEIGHT_BYTES = 16 << 30  # an SAE's tensors, as its file holds them
FLOAT_DTYPES = frozenset({"F32", "F16", "BF16", "F64"})
RESID_POST = re.compile(r"blocks\.(\d{1,4})\.hook_resid_post")  # SAELens's (TransformerLens') hook names
RESID_PRE = re.compile(r"blocks\.(\d{1,4})\.hook_resid_pre")
LAYER_OUTPUT = re.compile(r"model\.layers\.(\d{1,4})\.output")  # Gemma Scope 2's hf_hook_point_in
SPARSIFY_HOOK = re.compile(r"layers\.(\d{1,4})")  # sparsify's hook point folder


@dataclass(frozen=True)
class Layout:
    name: str
    config: str
    weights: str


SAELENS = Layout("SAELens", "cfg.json", "sae_weights.safetensors")
GEMMA_SCOPE = Layout("Gemma Scope 2", "config.json", "params.safetensors")
SPARSIFY = Layout("sparsify", "cfg.json", "sae.safetensors")
LAYOUTS = (SAELENS, GEMMA_SCOPE, SPARSIFY)


def read_saes(folder: str | Path) -> list[SparseAutoencoder]:
    """The SAEs in `folder`: one, or a sparsify checkpoint's, one per hook point (in layer order)."""
    path = Path(folder).expanduser()
    shown = safe_text(str(folder))
    if not path.is_dir():
        raise ModelLoadError(f"--sae {shown}: not a folder (an SAE is a folder of a config and its weights)")
    if _layout(path) is not None:
        return _noted([read_sae(path)])
    hooks = sorted(
        (p for p in path.iterdir() if p.is_dir() and SPARSIFY_HOOK.fullmatch(p.name) and _layout(p) is SPARSIFY),
        key=lambda p: int(p.name.split(".")[1]),
    )
    if not hooks:
        names = ", ".join(f"{layout.config} and {layout.weights} ({layout.name})" for layout in LAYOUTS)
        raise ModelLoadError(f"--sae {shown} holds no SAE: it needs {names}, or sparsify's layers.N folders")
    return _noted([read_sae(p) for p in hooks])


def _noted(saes: list[SparseAutoencoder]) -> list[SparseAutoencoder]:
    """`saes`, the notes beside each read now (features.feature_notes): a bad one is told with the SAE."""
    for sae in saes:
        notes_of(sae)
    return saes


def _layout(path: Path) -> Layout | None:
    for layout in LAYOUTS:
        if (path / layout.config).exists() and (path / layout.weights).exists():
            return layout
    return None


def read_sae(path: Path) -> SparseAutoencoder:
    """The SAE in the folder `path` (one of LAYOUTS)."""
    layout = _layout(path)
    assert layout is not None
    what = f"the SAE {safe_text(path.name)}"
    config = parse_json(read_file(path / layout.config, CONFIG_BYTES, f"{what}'s {layout.config}", ModelLoadError),
                        f"{what}'s {layout.config}", ModelLoadError, finite=True)  # fmt: skip
    if not isinstance(config, dict):
        raise ModelLoadError(f"{what}'s {layout.config} is not a table of settings")
    entries = read_header(path / layout.weights, f"{what}'s {layout.weights}")
    if layout is SAELENS:
        return _saelens(path, config, entries, what)
    if layout is GEMMA_SCOPE:
        return _gemma_scope(path, config, entries, what)
    return _sparsify(path, config, entries, what)


def _saelens(path: Path, config: dict[str, Any], entries: dict[str, TensorEntry], what: str) -> SparseAutoencoder:
    architecture = config.get("architecture", "standard")
    architecture = "jumprelu" if architecture == "jump_relu" else architecture
    if architecture not in ARCHITECTURES:
        raise ModelLoadError(f"{what} is a {_said(architecture)} SAE; tokenviz reads {', '.join(ARCHITECTURES)}")
    for name in ("normalize_activations", "reshape_activations"):
        if config.get(name, "none") != "none":
            raise ModelLoadError(f"{what}'s {name} is {_said(config[name])}: tokenviz reads an SAE that takes the "
                                 "residual as it is (none)")  # fmt: skip
    metadata = config.get("metadata")
    hook = config.get("hook_name") or (metadata.get("hook_name") if isinstance(metadata, dict) else None)
    layer = _layer_of_hook(hook, what)
    names = {"W_enc": "W_enc", "W_dec": "W_dec", "b_dec": "b_dec"}
    names |= {"b_enc": "b_gate", "b_mag": "b_mag", "r_mag": "r_mag"} if architecture == "gated" else {"b_enc": "b_enc"}
    names |= {"threshold": "threshold"} if architecture == "jumprelu" else {}
    k = _count(config, "k", what) if architecture == "topk" else 0
    tensors = _tensors(path / SAELENS.weights, entries, names, what, config.get("d_in"), config.get("d_sae"))
    apply = config.get("apply_b_dec_to_input", True)
    rescale = config.get("rescale_acts_by_decoder_norm", False)
    if not isinstance(apply, bool) or not isinstance(rescale, bool):
        raise ModelLoadError(f"{what}'s apply_b_dec_to_input and rescale_acts_by_decoder_norm are true or false")
    return _made(path, SAELENS, architecture, layer, tensors, what, apply=apply, k=k, rescale=rescale)


def _gemma_scope(path: Path, config: dict[str, Any], entries: dict[str, TensorEntry], what: str) -> SparseAutoencoder:
    if config.get("architecture") != "jump_relu":
        raise ModelLoadError(f"{what} is a {_said(config.get('architecture'))} SAE; Gemma Scope 2's are jump_relu")
    hook = config.get("hf_hook_point_in")
    match = LAYER_OUTPUT.fullmatch(hook) if isinstance(hook, str) else None
    if match is None:
        raise ModelLoadError(f"{what} reads {_said(hook)}; tokenviz reads the residual after a layer "
                             "(model.layers.N.output)")  # fmt: skip
    names = {"W_enc": "w_enc", "b_enc": "b_enc", "W_dec": "w_dec", "b_dec": "b_dec", "threshold": "threshold"}
    tensors = _tensors(path / GEMMA_SCOPE.weights, entries, names, what, None, None)
    return _made(path, GEMMA_SCOPE, "jumprelu", int(match.group(1)), tensors, what, apply=False)


def _sparsify(path: Path, config: dict[str, Any], entries: dict[str, TensorEntry], what: str) -> SparseAutoencoder:
    match = SPARSIFY_HOOK.fullmatch(path.name)
    if match is None:
        raise ModelLoadError(f"{what} is sparsify's for hook point {_said(path.name)}; tokenviz reads the residual "
                             "after a layer (layers.N)")  # fmt: skip
    if config.get("transcode") or config.get("skip_connection"):
        raise ModelLoadError(f"{what} is a transcoder (transcode, skip_connection): tokenviz reads an autoencoder")
    if config.get("activation", "topk") != "topk":
        raise ModelLoadError(f"{what}'s activation is {_said(config['activation'])}; tokenviz reads topk")
    names = {"W_enc": "encoder.weight", "b_enc": "encoder.bias", "W_dec": "W_dec", "b_dec": "b_dec"}
    tensors = _tensors(path / SPARSIFY.weights, entries, names, what, config.get("d_in"), None, transposed={"W_enc"})
    k = _count(config, "k", what)
    return _made(path, SPARSIFY, "topk", int(match.group(1)), tensors, what, apply=True, k=k)


def _made(
    path: Path,
    layout: Layout,
    architecture: Any,
    layer: int,
    t: dict[str, torch.Tensor],
    what: str,
    apply: bool,
    k: int = 0,
    rescale: bool = False,
) -> SparseAutoencoder:
    d_sae = int(t["W_enc"].shape[1])
    if architecture == "topk" and not 1 <= k <= d_sae:
        raise ModelLoadError(f"{what}'s k is {k}; it has {d_sae:,} features")
    return SparseAutoencoder(
        safe_text(path.name), layout.name, architecture, layer, t["W_enc"], t["b_enc"], t["W_dec"], t["b_dec"],
        apply_b_dec_to_input=apply, threshold=t.get("threshold"), k=k, rescale_by_decoder_norm=rescale,
        r_mag=t.get("r_mag"), b_mag=t.get("b_mag"), folder=str(path.resolve()),
    )  # fmt: skip


def _tensors(
    file: Path,
    entries: dict[str, TensorEntry],
    names: dict[str, str],
    what: str,
    d_in: object,
    d_sae: object,
    transposed: frozenset[str] | set[str] = frozenset(),
) -> dict[str, torch.Tensor]:
    """The tensors `names` (ours: the file's), float32, checked before a byte is read (`_check_shapes`) and
    finite once read."""
    _check_shapes(entries, names, what, d_in, d_sae, transposed)
    loaded = load_file(str(file))
    tensors = {}
    for ours, theirs in names.items():
        tensor = loaded[theirs].to(torch.float32)
        if not torch.isfinite(tensor).all():
            raise ModelLoadError(f"{what}'s {safe_text(theirs)} holds values that are not finite numbers")
        tensors[ours] = tensor.T.contiguous() if ours in transposed else tensor.contiguous()
    return tensors


def _check_shapes(
    entries: dict[str, TensorEntry],
    names: dict[str, str],
    what: str,
    d_in: object,
    d_sae: object,
    transposed: frozenset[str] | set[str],
) -> None:
    """Each tensor there, floating point, of the shape the encoder's (d_in, d_sae) make it (and the config's
    d_in and d_sae where it gives them), the features at most MAX_FEATURES and the bytes MAX_WEIGHT_BYTES."""
    for name in names.values():
        entry = entries.get(name)
        if entry is None:
            raise ModelLoadError(f"{what}'s weights hold no {safe_text(name)}")
        if entry.dtype not in FLOAT_DTYPES:
            raise ModelLoadError(f"{what}'s {safe_text(name)} is {entry.dtype}, not floating point")
    enc = entries[names["W_enc"]].shape
    if len(enc) != 2:
        raise ModelLoadError(f"{what}'s encoder is not a matrix: {list(enc)}")
    inputs, features = (enc[1], enc[0]) if "W_enc" in transposed else enc
    if not 1 <= features <= MAX_FEATURES:
        raise ModelLoadError(f"{what} has {features:,} features; tokenviz reads SAEs of up to {MAX_FEATURES:,}")
    for given, actual, called in ((d_in, inputs, "d_in"), (d_sae, features, "d_sae")):
        if given is not None and given != actual:
            raise ModelLoadError(f"{what}'s config says {called} {_said(given)}; its encoder has {actual:,}")
    expected = {"W_dec": (features, inputs), "b_dec": (inputs,), "b_enc": (features,), "threshold": (features,),
                "r_mag": (features,), "b_mag": (features,)}  # fmt: skip
    for ours, theirs in names.items():
        shape = entries[theirs].shape
        want = expected.get(ours, (features, inputs) if ours in transposed else (inputs, features))
        if shape != want:
            raise ModelLoadError(f"{what}'s {safe_text(theirs)} is {list(shape)}, not {list(want)}")
    if sum(entries[name].bytes for name in names.values()) > MAX_WEIGHT_BYTES:
        raise ModelLoadError(f"{what}'s weights are over {MAX_WEIGHT_BYTES >> 30} GB")


def _layer_of_hook(hook: object, what: str) -> int:
    """The decoder layer whose output an SAELens hook name reads (hook_resid_pre of block L: layer L - 1's)."""
    post = RESID_POST.fullmatch(hook) if isinstance(hook, str) else None
    if post is not None:
        return int(post.group(1))
    pre = RESID_PRE.fullmatch(hook) if isinstance(hook, str) else None
    if pre is not None and int(pre.group(1)) > 0:
        return int(pre.group(1)) - 1
    if hook is None:
        raise ModelLoadError(f"{what}'s cfg.json names no hook_name (blocks.N.hook_resid_post): where it reads")
    raise ModelLoadError(f"{what} reads {_said(hook)}; tokenviz reads the residual after a layer "
                         "(blocks.N.hook_resid_post, or hook_resid_pre of the block after it)")  # fmt: skip


def _count(config: dict[str, Any], name: str, what: str) -> int:
    value = config.get(name)
    if type(value) is not int or value < 1:
        raise ModelLoadError(f"{what}'s {name} is {_said(value)}, not a count")
    return value


def _said(value: object) -> str:
    return safe_text(repr(value)[:60])
