"""The web room: the HTTP plumbing every surface shares: the error envelope, strict JSON
bodies, body limits, Server-Sent Events and the server's Prometheus metrics."""
