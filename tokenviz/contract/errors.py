"""Errors a user can cause and fix. Each carries one line that is shown as is, never a traceback."""


class TokenvizError(Exception):
    """A foreseeable problem with the user's input or environment."""


class SettingsError(TokenvizError):
    """A sampling setting out of its range."""


class ModelLoadError(TokenvizError):
    """The model could not be found or loaded."""


class Cancelled(TokenvizError):
    """The user cancelled a long computation; nothing changed."""


class GiveWay(Exception):
    """An autoplay step set aside between layers because a command is waiting (Session.step's give_way):
    nothing it did is kept, and the step runs again after the command. Not an error."""


class PromptError(TokenvizError):
    """The prompt cannot be run (empty, or longer than the model's context)."""
