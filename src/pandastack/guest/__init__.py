"""The pandastack guest agent (stdlib only; runs inside the microVM as ``pandastack_guest``).

Everything in this package imports only the standard library and its own modules, with
relative imports: the image builder copies ``guest/*.py`` into the guest as the package
``pandastack_guest``. The host imports ``pandastack.guest.protocol`` for the frame codec.
"""

__version__ = "0.1.0"
