"""E2B's Python SDK through Caddy in front, for tests/e2e/test_tls_caddy.py: only E2B_DOMAIN
(no E2B_API_URL or E2B_SANDBOX_URL), so it reaches `api.<domain>` and the daemon at
`49983-{id}.<domain>`, with the CA in SSL_CERT_FILE. The proxy given stands in for DNS (no
names resolve on a test machine). On the sandbox the test made: a command whose first line
must arrive while it still runs, a file written and read back, then the sandbox killed.
Prints one JSON object: what it saw.

    python over_caddy.py SANDBOX_ID PROXY_URL
"""

from __future__ import annotations

import hashlib
import json
import sys
from typing import Any

from e2b import Sandbox

PAYLOAD = bytes(range(256)) * 8192  # 2 MiB, one upload and one download


def main() -> None:
    sandbox_id, proxy = sys.argv[1:3]
    sbx = Sandbox.connect(sandbox_id, proxy=proxy)
    seen: dict[str, Any] = {"payload_sha256": hashlib.sha256(PAYLOAD).hexdigest()}
    # The command reads stdin before it can end, and stdin is sent only once its first line
    # came: a proxy holding the stream back until the response ends would hang it here.
    handle = sbx.commands.run("echo first; read word; echo then $word", background=True,
                              stdin=True)
    chunks: list[str] = []

    def on_stdout(text: str) -> None:
        if not chunks:
            sbx.commands.send_stdin(handle.pid, "go\n")
        chunks.append(text)

    result = handle.wait(on_stdout=on_stdout)
    seen["streamed"] = {"first": chunks[0] if chunks else None, "stdout": result.stdout,
                        "exit": result.exit_code}
    sbx.files.write("/tmp/over-caddy.bin", PAYLOAD)
    back = sbx.files.read("/tmp/over-caddy.bin", format="bytes")
    seen["read_sha256"] = hashlib.sha256(bytes(back)).hexdigest()
    seen["killed"] = sbx.kill()
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
