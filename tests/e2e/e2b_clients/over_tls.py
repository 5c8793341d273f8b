"""E2B's Python SDK over TLS, for tests/e2e/test_tls_serve.py: one sandbox made through
E2B_API_URL and E2B_SANDBOX_URL (`serve`'s own TLS), a command and a file each way, then the
same through the nginx in front (the API and sandbox URLs given as arguments), and killed
there. The CA comes only from what a user sets (SSL_CERT_FILE). Prints one JSON object: what
each way saw.

    python over_tls.py PROXY_API_URL PROXY_SANDBOX_URL
"""

from __future__ import annotations

import hashlib
import json
import sys
from typing import Any

from e2b import Sandbox

# Over nginx's default body limit (1 MiB): the guide's `client_max_body_size 0` is needed.
PAYLOAD = bytes(range(256)) * 8192


def exercise(sbx: Sandbox, way: str) -> dict[str, Any]:
    ran = sbx.commands.run(f"echo {way} $((6*7))")
    sbx.files.write(f"/tmp/{way}.bin", PAYLOAD)
    back = sbx.files.read(f"/tmp/{way}.bin", format="bytes")
    return {"stdout": ran.stdout, "exit": ran.exit_code,
            "read_sha256": hashlib.sha256(bytes(back)).hexdigest()}


def main() -> None:
    proxy_api, proxy_sandbox = sys.argv[1:3]
    seen: dict[str, Any] = {"payload_sha256": hashlib.sha256(PAYLOAD).hexdigest()}
    sbx = Sandbox.create("base", timeout=300)
    seen["id"] = sbx.sandbox_id
    try:
        seen["direct"] = exercise(sbx, "direct")
        again = Sandbox.connect(sbx.sandbox_id, api_url=proxy_api, sandbox_url=proxy_sandbox)
        seen["proxy"] = exercise(again, "proxy")
        seen["killed"] = again.kill()
    finally:
        if "killed" not in seen:
            sbx.kill()
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
