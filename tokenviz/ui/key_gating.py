"""Which of the journey's keys are on for what is on screen: a recording's keys that need a model are off,
and so is a key whose view needs a capability the engine lacks (contract.engine); pressed, each says why
in one line, and the help lists them at its top by what they need."""

from __future__ import annotations

from tokenviz.contract.engine import Capability, refusal_of
from tokenviz.contract.snapshot import Snapshot
from tokenviz.ui.keys import KEYS, model_actions, model_keys, needs_of, unrouted
from tokenviz.ui.panes.base import live_command

MODEL_ACTIONS = model_actions()  # their keys are off in a recording
MODEL_KEYS = model_keys()
KEY_ACTIONS = {key: p.action for row in KEYS for p in row.presses for key in p.key.split(",")}  # Textual's key names
PALETTE_LABELS = {p.action: p.palette or p.footer for row in KEYS for p in row.presses if p.palette or p.footer}


def what_it_lacks(s: Snapshot | None, action: str, brief: bool = False) -> str | None:
    """One line saying what `action` needs that this live engine cannot do (`brief`: for a
    notification); None when it can."""
    action = unrouted(action)
    needed = needs_of(action)
    if s is None or not s.live or s.info is None or needed is None:
        return None
    return refusal_of(s.info, needed, PALETTE_LABELS.get(action, action), brief)


def action_on(s: Snapshot | None, action: str, parameters: tuple[object, ...]) -> bool:
    """Whether a key's action is on (Textual's check_action): off in a recording where it needs the model,
    and where the engine lacks what its view needs."""
    if action == "route":  # a pane's own action (see keys.routed): judged as its action string
        whole = str(parameters[1])
    else:
        whole = f"{action}({', '.join(repr(p) for p in parameters)})" if parameters else action
    if s is not None and not s.live and whole.split("(")[0] in MODEL_ACTIONS:
        return False
    return what_it_lacks(s, whole) is None


def keys_off(s: Snapshot | None) -> str:
    """The help's first lines: the keys this engine cannot serve, by what they need ('' where none)."""
    off: dict[Capability | None, list[str]] = {}
    for key, action in KEY_ACTIONS.items():
        if what_it_lacks(s, action) is not None:
            off.setdefault(needs_of(action), []).append(key)
    if not off or s is None or s.info is None:
        return ""
    listed = "; ".join(f"{', '.join(keys)} ({needed})" for needed, keys in off.items())
    return f"**Not on this engine** ({s.info.name} gives {', '.join(s.info.capabilities)}): {listed}\n\n"


def key_refusal(s: Snapshot | None, key: str) -> str | None:
    """What a key pressed that is off says (a recording's that needs the model: how to run it live), or None."""
    if s is not None and not s.live and s.info is not None and key in MODEL_KEYS:
        return (
            f"{key} needs the model: a recording replays what was kept. "
            f"Run it live with {live_command(s.info)} and the journey's prompt"
        )
    if key in KEY_ACTIONS:
        return what_it_lacks(s, KEY_ACTIONS[key], brief=True)
    return None
