"""The web console served at ``/console`` (see docs/console.md)."""

from genhook.console.routes import install_console

__all__ = ["install_console"]
