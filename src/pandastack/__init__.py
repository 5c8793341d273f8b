"""pandastack: microVM sandboxes for code that an AI agent wrote."""

__version__ = "0.1.0"
