"""Which model the transformers backend loads, and how: its options (each a BackendOption, declared here
once) and the value they make, checked before torch is imported."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tokenviz.contract.backend import WITH_COMPARE, BackendOption, Opening, Progress
from tokenviz.contract.errors import SettingsError
from tokenviz.contract.placement import Placement
from tokenviz.system.placement_files import resolved

if TYPE_CHECKING:
    from tokenviz.backends.transformers.loading import LoadedModel
    from tokenviz.backends.transformers.model_loader import BeforeWeights, ModelLoader

OPTIONS = (
    BackendOption(
        "device",
        "auto (GPU if there is one, the default), cpu, cuda or mps.",
        commands=WITH_COMPARE,
    ),
    BackendOption(
        "dtype",
        "auto (the default), float32, bfloat16 or float16.",
        commands=WITH_COMPARE,
    ),
    BackendOption(
        "trust_remote_code",
        "Allow a model's own Python code to run.",
        kind="flag",
        commands=WITH_COMPARE,
    ),
    BackendOption(
        "device_map",
        "auto, balanced, sequential, cpu or FILE.json: spread the weights over the GPUs, the CPU and the disk "
        "(accelerate's device map), within --max-memory.",
        commands=WITH_COMPARE,
    ),
    BackendOption(
        "max_memory",
        "DEVICE=SIZE (repeatable): the most a device may give the model, as cpu=8GB or cuda:0=20GB.",
        kind="texts",
        commands=WITH_COMPARE,
    ),
    BackendOption(
        "offload_dir",
        "With --device-map: where weights offloaded to disk go.",
        commands=WITH_COMPARE,
    ),
    BackendOption(
        "quantize",
        "int8 or int4: quantize the weights as they load (torchao; int4 needs a CUDA GPU).",
        commands=WITH_COMPARE,
    ),
    BackendOption(
        "compile",
        "Compile the decode step (torch.compile over a static cache; CUDA graphs on a GPU). It takes a while "
        "once, at start.",
        kind="flag",
        commands=WITH_COMPARE,
    ),
)


@dataclass(frozen=True)
class ModelChoice:
    """Which model the transformers backend loads, and how (its options' values)."""

    model: str | None = None  # None: the bundled one
    device: str = "auto"
    dtype: str = "auto"
    trust_remote_code: bool = False
    device_map: str | None = None
    max_memory: tuple[str, ...] = ()  # DEVICE=SIZE entries
    offload_dir: str | None = None
    quantize: str | None = None
    compile: bool = False  # the decode step compiled (see tokenviz.backends.transformers.compiled_step)

    placement: Placement = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:  # a mistake in the placement is refused here, before torch is imported
        # the files it names read and checked now, once, not after torch's import
        placement = resolved(Placement(self.device_map, tuple(self.max_memory or ()), self.offload_dir, self.quantize))
        object.__setattr__(self, "max_memory", placement.max_memory)
        object.__setattr__(self, "placement", placement)
        if self.compile and self.device_map is not None:
            raise SettingsError("--compile runs a model on one device; --device-map spreads it: choose one")

    @classmethod
    def of(cls, opening: Opening) -> ModelChoice:
        """The choice `--model` and the backend's options' values make."""
        return cls(
            opening.model,
            device=opening.text("device") or "auto",
            dtype=opening.text("dtype") or "auto",
            trust_remote_code=opening.flag("trust_remote_code"),
            device_map=opening.text("device_map"),
            max_memory=opening.texts("max_memory"),
            offload_dir=opening.text("offload_dir"),
            quantize=opening.text("quantize"),
            compile=opening.flag("compile"),
        )

    def load(self, progress: Progress, before_weights: BeforeWeights | None = None) -> LoadedModel:
        return self.loader(before_weights)(progress)

    def loader(self, before_weights: BeforeWeights | None = None) -> ModelLoader:
        """A loader for a worker's thread (the model loads there, after the app's first frame);
        `before_weights` checks the config and tokenizer first (see backends.transformers.loading.load_model)."""
        from tokenviz.backends.transformers.model_loader import model_loader

        return model_loader(
            self.model, self.device, self.dtype, self.trust_remote_code, self.placement, self.compile, before_weights
        )
