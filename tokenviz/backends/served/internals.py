"""A served model's internals through the vllm-lens plugin: the logit lens and attention rows.

Each is one ordinary completion request carrying `vllm_xargs` (the plugin reads them; a server without it
ignores them): `output_residual_stream` (the residual after each decoder layer, every position) and
`output_qk` (the post-rotary queries and keys of the layers asked, with the scale, soft-cap, window and
sinks vLLM hands its kernel). The plugin recomputes the whole prompt for such a request (it skips reading
vLLM's prefix cache), so what comes back is the model's own pass over these tokens. Nothing of the
plugin's runs here: tokenviz.backends.served.activations reads its answers.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from tokenviz.backends.served.activations import QkMeta, qk_meta, tensor, value_bytes, wire_bytes
from tokenviz.backends.served.completions import answered, checked_logprob, choice_of, top_of
from tokenviz.backends.served.head_from_files import OutputHead
from tokenviz.backends.shared.endpoint import Endpoint, EndpointError, NoAnswer
from tokenviz.backends.shared.output_head import inspections
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.lens_layers import EXAMPLE
from tokenviz.contract.results import Inspection, LensAsk
from tokenviz.tensors.threads import one_thread_on_cpu

CPU = torch.device("cpu")  # the head is read into the host's memory
PLUGIN = "vllm-lens"
INSTALL = (
    "pip install --no-deps --ignore-requires-python vllm-lens==1.3.0 zstandard into the server's "
    "environment, then restart it"
)
CAPTURE_BUDGET_BYTES = 1 << 30  # what one capture of internals may take as sent (float32: 4 bytes a value)
FLOAT_BYTES = 4  # a value as the plugin sends a float32 model's (bfloat16 and float16: 2, seen at the probe)
PROBE_BYTES = 16 << 20  # the probe's one layer over a few tokens, at any width
HEAD_CHECK = 0.02  # nats: the lens's last layer against the server's own log-probability (a wrong DIR is far off)


@dataclass(frozen=True)
class Plugin:
    """What the server's vllm-lens answered to the probe: a residual stream, queries and keys, and the
    bytes of each value it sends (its model's dtype: 4 for float32, 2 for bfloat16 and float16)."""

    residual: bool
    qk: bool
    value_bytes: int = FLOAT_BYTES


def probe(endpoint: Endpoint, model: str, ids: Sequence[int]) -> Plugin:
    """One request asking for a layer's residual and queries and keys: what comes back says what the
    server exposes (a server without the plugin answers the completion alone; one that refuses the
    request's extra fields, as a server that is not vLLM may, exposes nothing)."""
    xargs = {"output_residual_stream": [0], "output_qk": "[0]"}
    try:
        answer = answered(endpoint, model, ids, {"temperature": 0}, 0, PROBE_BYTES, vllm_xargs=xargs)
    except NoAnswer:
        raise  # a server that does not answer lacks nothing: it is not asked again
    except EndpointError:
        return Plugin(False, False)
    activations = answer.get("activations")
    if not isinstance(activations, dict):
        return Plugin(False, False)
    entry = activations.get("residual_stream")
    qk = "attn_q" in activations and "attn_k" in activations
    return Plugin(entry is not None, qk, value_bytes(entry) or FLOAT_BYTES)


@dataclass(frozen=True)
class Capture:
    """The residual stream a step's own request brought back (the lens in use): the decoder layers the
    lens last asked for, every position of `ids`, under the interventions `steering` names; and the token
    the server gave there."""

    ids: tuple[int, ...]
    steering: object  # what was in force (the engine's ServedSteering while active, else None)
    layers: tuple[int, ...]  # the decoder layers captured, in order (the last among them)
    residual: np.ndarray  # (layers, positions, hidden)
    served: tuple[int, float]  # (token, log-probability) the server returned after `ids`


class ServedInternals:
    """The lens and attention rows of the model a server with vllm-lens runs, read through `head`.

    While the lens is in use (it was asked for since the last step), a step's own request also asks for
    the residual stream, so the lens at any position of that context costs no request of its own
    (`step_xargs`, `keep`); a step after one whose capture went unused asks for none."""

    def __init__(
        self,
        endpoint: Endpoint,
        model: str,
        head: OutputHead,
        plugin: Plugin,
        steered: Callable[[Sequence[int], dict[str, Any]], dict[str, Any]] = lambda ids, xargs: {"vllm_xargs": xargs},
    ):
        """`steered(ids, xargs)`: a request's extra fields with the plugin's `xargs` and the interventions in
        force (the engine's), so the lens and attention rows are the intervened model's, as locally."""
        self.endpoint, self.model, self.head, self.plugin = endpoint, model, head, plugin
        self.steered = steered
        config = head.config
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(getattr(config, "num_key_value_heads", None) or self.heads)
        self.head_dim = int(getattr(config, "head_dim", None) or head.hidden // self.heads)
        self.wanted = False  # the lens was asked for since the last step: the next step captures
        self.captured: Capture | None = None
        self.asked: tuple[int, ...] = tuple(range(head.layers))  # the decoder layers the lens last asked for
        self.head_checked = False  # the head gave the server's own log-probability once (see _check_head)

    def step_xargs(self, positions: int) -> tuple[dict[str, Any], int]:
        """What a step's request over `positions` tokens asks of the plugin, and the most it takes as sent:
        the residual stream while the lens is in use, where it fits the capture budget (else nothing: the
        lens then asks, and says why not)."""
        wanted, self.wanted = self.wanted, False
        xargs = {"output_residual_stream": list(self.asked)}
        try:
            size = self.checked_capture(xargs, positions) if wanted else 0
        except TokenvizError:
            size = 0
        if not size:
            self.captured = None
            return {}, 0
        return xargs, size

    def capture_bytes(self, xargs: dict[str, Any], positions: int) -> int:
        """The most the activations `xargs` ask for over `positions` tokens take as sent: each layer's
        residual (hidden values a position), queries and keys (heads and KV heads of head_dim)."""
        residual = len(xargs.get("output_residual_stream", ())) * positions * self.head.hidden
        qk = len(json.loads(xargs["output_qk"])) if "output_qk" in xargs else 0
        keys = qk * positions * (self.heads + self.kv_heads) * self.head_dim
        return sum(wire_bytes(n * self.plugin.value_bytes) for n in (residual, keys) if n)

    def checked_capture(self, xargs: dict[str, Any], positions: int) -> int:
        """capture_bytes, refused in one line (its size, and what to do) past CAPTURE_BUDGET_BYTES."""
        size = self.capture_bytes(xargs, positions)
        if size > CAPTURE_BUDGET_BYTES:
            layers = len(xargs.get("output_residual_stream", ())) or len(json.loads(xargs.get("output_qk", "[]")))
            fewer = f"show fewer lens layers (--lens-layers {EXAMPLE})" if xargs.get("output_residual_stream") else ""
            raise TokenvizError(
                f"{self.endpoint.host} would send {size / 1e6:,.0f} MB for {layers} layers at {positions:,} "
                f"positions, over the {CAPTURE_BUDGET_BYTES / 1e6:,.0f} MB a capture may take: "
                f"{fewer + ', or ' if fewer else ''}step from a shorter context"
            )
        return size

    def keep(self, ids: Sequence[int], steering: object, answer: dict[str, Any], served: tuple[int, float]) -> None:
        """Keep the residual stream a step's request (asked with `step_xargs`) brought back."""
        activations = answer.get("activations")
        if not isinstance(activations, dict):
            raise EndpointError(f"{self.endpoint.host} answered without the activations asked ({PLUGIN} gone?)")
        layers = self.asked  # what step_xargs asked for
        shape = (len(layers), len(ids), self.head.hidden)
        residual = tensor(activations, "residual_stream", shape, self.endpoint.host)
        self.captured = Capture(tuple(ids), steering, layers, residual, served)

    def _from_step(self, ids: Sequence[int], steering: object, layers: Sequence[int]) -> Capture | None:
        """The last step's capture where it holds `ids` (a prefix of its context, the same interventions)
        at `layers`."""
        c = self.captured
        if c is None or c.steering is not steering or len(ids) > len(c.ids) or tuple(ids) != c.ids[: len(ids)]:
            return None
        return c if set(layers) <= set(c.layers) else None

    def _activations(
        self, ids: Sequence[int], xargs: dict[str, Any], extra: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The activations `xargs` ask for over `ids` and the answer's choice; `extra`: the request's other
        fields (by default the interventions in force)."""
        size = self.checked_capture(xargs, len(ids))
        if extra is None:
            extra = self.steered(ids, xargs)
        else:
            extra = {**extra, "vllm_xargs": {**extra.get("vllm_xargs", {}), **xargs}}
        answer = answered(self.endpoint, self.model, ids, {"temperature": 0}, 1, size, **extra)
        activations = answer.get("activations")
        if not isinstance(activations, dict):
            raise EndpointError(f"{self.endpoint.host} answered without the activations asked ({PLUGIN} gone?)")
        return activations, choice_of(answer, self.endpoint.host)

    @torch.inference_mode()
    def inspect(self, engine: Any, ask: LensAsk) -> list[Inspection]:
        """Each position's lens (the embeddings, then the residual after each decoder layer of its rows, or of
        every one, through the model's own final norm and head), from one request over its ids asking for
        those layers alone (and the last, which the head is checked on)."""
        self.wanted = True
        ids, positions, chosen, pinned = list(ask.ids), list(ask.positions), list(ask.chosen), ask.pinned
        layers, host = self.head.layers, self.endpoint.host
        rows = tuple(range(layers + 1)) if ask.rows is None else ask.rows
        decoder = tuple(sorted({row - 1 for row in rows if row > 0} | {layers - 1}))
        self.asked = decoder
        step = self._from_step(ids, engine.steering_in_force(), decoder)
        if step is not None:  # the step's own request brought it: no request here
            residual = step.residual[[step.layers.index(layer) for layer in decoder], : len(ids)]
            served, checked = step.served, step.residual[-1, len(step.ids) - 1]
        else:
            activations, choice = self._activations(ids, {"output_residual_stream": list(decoder)})
            residual = tensor(activations, "residual_stream", (len(decoder), len(ids), self.head.hidden), host)
            token, logprob, _ = top_of(choice, host, 1)
            served, checked = (token, checked_logprob(logprob, host)), residual[-1, len(ids) - 1]
        with one_thread_on_cpu(CPU):  # a few rows through the head: see one_thread_on_cpu
            if not self.head_checked and engine.raw is not False:
                self._check_head(torch.from_numpy(checked), served)
            embedded = self.head.embed(ids)  # row 0; row i follows decoder layer i - 1
            shown = torch.stack(
                [embedded if row == 0 else torch.from_numpy(residual[decoder.index(row - 1)]) for row in rows]
            )
            embedding_rows = self.head.embeddings.weight[[ids[p] for p in positions]].float()
            return inspections(
                shown, ids, positions, chosen, pinned, self.head.logits, embedding_rows, engine, rows=rows
            )

    def _check_head(self, last: torch.Tensor, served: tuple[int, float]) -> None:
        """Refuse a head (--tokenizer DIR) that does not give the server's own log-probability of the token
        it served from the last layer's residual `last` (checked once: a wrong directory is far off)."""
        token, logprob = served
        own = float(torch.log_softmax(self.head.logits(last), -1)[token])
        if abs(own - logprob) > HEAD_CHECK:
            raise TokenvizError(
                f"the lens's head (--tokenizer) does not give {self.endpoint.host}'s distribution: the served "
                f"token's log-probability is {own:.4f} here and {logprob:.4f} there (is it the served model's "
                "directory?)"
            )
        self.head_checked = True

    def residual(self, ids: Sequence[int], layer: int, extra: dict[str, Any] | None = None) -> np.ndarray:
        """The residual stream after decoder layer `layer` at every position of `ids` (positions, hidden),
        from a request with `extra` fields (the steering vectors it carries: {} for the model's own; None, the
        interventions in force)."""
        activations, _ = self._activations(ids, {"output_residual_stream": [layer]}, extra)
        stream = tensor(activations, "residual_stream", (1, len(ids), self.head.hidden), self.endpoint.host)
        return np.asarray(stream[0])

    @torch.inference_mode()
    def attention(self, ids: Sequence[int], rows: range, layers: Sequence[int]) -> torch.Tensor:
        """Exact attention weights of positions `rows` for `layers`: (layers, heads, rows, rows.stop), the
        server's queries and keys replayed with its own scale, soft-cap, window and sinks."""
        if not self.plugin.qk:
            raise TokenvizError(f"{self.endpoint.host}'s {PLUGIN} did not send queries and keys")
        layers, host, context = list(layers), self.endpoint.host, list(ids[: rows.stop])
        activations, _ = self._activations(context, {"output_qk": json.dumps(layers)})
        n = len(context)
        q = tensor(activations, "attn_q", (len(layers), n, self.heads, self.head_dim), host)
        k = tensor(activations, "attn_k", (len(layers), n, self.kv_heads, self.head_dim), host)
        metas = qk_meta(activations, layers, self.heads, host)
        weights = torch.stack(
            [
                replay(torch.from_numpy(q[i, rows.start : rows.stop]), torch.from_numpy(k[i]), meta, rows.start)
                for i, meta in enumerate(metas)
            ]
        )
        if not torch.isfinite(weights).all():
            raise EndpointError(
                f"{host}'s queries, keys and scale give attention weights that are not numbers: the server's "
                "answer is wrong"
            )
        return weights


def replay(q: torch.Tensor, k: torch.Tensor, meta: QkMeta, start: int) -> torch.Tensor:
    """Attention weights (heads, queries, keys) of queries `q` (queries, heads, dim) at positions from
    `start` over keys `k` (keys, kv heads, dim), as vLLM's kernel computes them: softmax of the causal,
    windowed, soft-capped Q·Kᵀ × scale (plus ALiBi), a sink's logit in the denominator where there is one."""
    heads, kv_heads = q.shape[1], k.shape[1]
    if heads % kv_heads:
        raise TokenvizError(f"{heads} query heads cannot share {kv_heads} key heads")
    k = k.repeat_interleave(heads // kv_heads, dim=1)
    logits = torch.einsum("qhd,khd->hqk", q.double(), k.double()) * meta.scale
    if meta.soft_cap > 0:
        logits = meta.soft_cap * torch.tanh(logits / meta.soft_cap)
    relative = torch.arange(k.shape[0])[None, :] - torch.arange(start, start + q.shape[0])[:, None]  # key − query
    if meta.alibi is not None:
        logits = logits + torch.tensor(meta.alibi, dtype=logits.dtype)[:, None, None] * relative
    left, right = meta.window
    hidden = relative > max(right, 0)
    if left >= 0:
        hidden |= relative < -left
    logits = logits.masked_fill(hidden[None], float("-inf"))
    if meta.sinks is not None:
        sinks = torch.tensor(meta.sinks, dtype=logits.dtype)[:, None, None].expand(heads, q.shape[0], 1)
        weights = torch.softmax(torch.cat([logits, sinks], -1), -1)[..., :-1]
    else:
        weights = torch.softmax(logits, -1)
    return weights.float()
