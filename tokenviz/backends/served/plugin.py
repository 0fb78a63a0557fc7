"""The served backend as a plugin (contract.backend): a model an OpenAI-compatible server runs (vLLM's; its
insides through the vllm-lens plugin), chosen by --endpoint. Imports nothing heavy: the command line is
built from it before anything loads."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tokenviz.contract.backend import WITH_COMPARE, BackendOption, OpenEngine, Opening, Progress
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.interventions import HeadAblation

if TYPE_CHECKING:
    from tokenviz.backends.served.completions import ServedChoice
    from tokenviz.backends.served.engine import ServedEngine

WITH_ENDPOINT = "With --endpoint: "


class ServedBackend:
    name = "server"
    about = "the model an OpenAI-compatible server runs (vLLM's), a request per token; inside it with vllm-lens"
    weights_here, draws = False, True
    options = (
        BackendOption(
            "endpoint",
            "URL of an OpenAI-compatible server (as vLLM's: http://127.0.0.1:8000/v1).",
            commands=WITH_COMPARE,
        ),
        BackendOption(
            "served_model",
            WITH_ENDPOINT + "the model to ask for (default: the one served).",
            commands=WITH_COMPARE,
        ),
        BackendOption(
            "api_key_env",
            WITH_ENDPOINT + "the environment variable holding the API key.",
            commands=WITH_COMPARE,
        ),
        BackendOption(
            "api_key_file",
            WITH_ENDPOINT + "a file holding the API key (one line).",
            commands=WITH_COMPARE,
        ),
        BackendOption(
            "insecure_http",
            "Send the API key over plain http to a host other than this machine.",
            kind="flag",
            commands=WITH_COMPARE,
        ),
        BackendOption(
            "tokenizer",
            WITH_ENDPOINT + "a Hugging Face tokenizer (id or directory) to tokenize with here, checked once against "
            "the server's (default: the server's own /tokenize and /detokenize); the model's directory also gives "
            "its lens, attention rows and steering where the server has vllm-lens.",
            commands=frozenset({"app", "trace", "serve", "replay"}),
        ),
    )

    def asked(self, given: frozenset[str]) -> bool:
        return bool(given)  # any of its options: without --endpoint, choice says what they go with

    def choice(self, opening: Opening) -> ServedChoice:
        """The server's options as one value (the key's file checked to be its owner's alone)."""
        from tokenviz.backends.served.completions import ServedChoice
        from tokenviz.backends.shared.endpoint import ApiKey

        endpoint = opening.text("endpoint")
        if endpoint is None:
            names = [o.flag for o in self.options if o.name != "endpoint" and opening.command in o.commands]
            raise TokenvizError(f"{', '.join(names[:-1])} and {names[-1]} go with --endpoint URL")
        key = ApiKey(opening.text("api_key_env"), opening.text("api_key_file"))
        if (exposed := key.exposed()) is not None:
            opening.warn(exposed)
        return ServedChoice(endpoint, opening.text("served_model"), key, opening.flag("insecure_http"))

    def loader(self, opening: Opening) -> OpenEngine:
        """The server checked to answer and to serve the model before anything opens (an unreachable one is
        one line within seconds); the engine is made in the worker, with --tokenizer loaded there and
        checked against the server's."""
        from tokenviz.backends.served.completions import served_model_name

        if opening.model is not None:
            raise TokenvizError("--model is for a model loaded here: a served model (--endpoint) is the server's")
        if opening.settings.grammar is not None:
            raise TokenvizError(
                "a grammar stage needs tokenviz to draw each token: a server draws its own (--endpoint)"
            )
        if any(isinstance(i, HeadAblation) for i in opening.interventions):
            from tokenviz.backends.served.steering import NO_ABLATION

            raise TokenvizError(f"--ablate: {NO_ABLATION}")
        choice = self.choice(opening)
        endpoint = choice.connect()
        name = served_model_name(endpoint, choice.model)
        files = opening.text("tokenizer")

        def load(progress: Progress) -> ServedEngine:
            from tokenviz.backends.served.engine import ServedEngine, tokenizer_here

            here = None  # the tokenizer named with --tokenizer, loaded in this thread
            if files is not None:
                progress(f"loading the tokenizer {files}", None)
                here = tokenizer_here(files)
            progress(f"asking {endpoint.host} about {name}", 0.5)
            endpoint.tell(progress)
            return ServedEngine(endpoint, name, local_tokenizer=here, model_files=files)

        return load


BACKEND = ServedBackend()
