"""A user's own hook module that vLLM never imports: its hook must be reported not loaded."""

from servewitness_probe import hook


@hook("user_patched")
def on_step() -> None:
    """Would count a step if anything ever called it."""
