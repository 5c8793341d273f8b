"""The pandastack guest agent (stdlib only; runs inside the microVM as ``pandastack_guest``).

Everything in this package imports only the standard library, its own modules (relative
imports) and the guest protocol's room ``pandastack.guestproto`` (absolute imports): the image
builder copies ``guest/*.py`` into the guest as the package ``pandastack_guest`` and the room
beside it as ``pandastack.guestproto``. The host imports nothing of this package.
"""

__version__ = "0.2.0.dev0"
