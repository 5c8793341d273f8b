"""The preview room: sandbox ports reached from outside: the preview listener on its own
origin, signed port URLs and the WebSocket relay."""
