"""A request's latency in the shape of a device timer: what a step record reads of a served model's time."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RequestTimer:
    """Milliseconds a request took (network included), read as a DeviceTimer is (`wait().ms()`)."""

    milliseconds: float = 0.0

    def wait(self) -> RequestTimer:
        return self

    def ms(self) -> float:
        return self.milliseconds
