"""E2B's wire contracts over pandastack (docs/e2b.md, ADR 0041).

- `rest/`: E2B's REST API on the API listener (`/sandboxes`, `/v2/sandboxes`, ...), called by
  the SDKs with `X-API-Key`: our keys, teams, quotas and events.
- `listener.py`: on the sandbox-port listener, a request that names a sandbox by the
  `E2b-Sandbox-Id` / `E2b-Sandbox-Port` headers or by a `{port}-{sandbox id}.{domain}` host
  name goes to that sandbox's daemon (`envd/`, port 49983), its code interpreter
  (`interpreter.py`, port 49999) or its other ports (our port proxy).
- `envd/`: E2B's in-sandbox protocol (Connect RPC, `/files`, `/health`, ...) answered by our
  guest agent's operations through the sandbox port: no second agent in the guest.
- `tokens.py`: every sandbox's `envdAccessToken` and `trafficAccessToken`, derived, not stored.
"""
