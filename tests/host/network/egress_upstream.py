"""A test web site for the egress proxy tests (stdlib only): HTTP on 80 and HTTPS on 443 at
one address, answering every request with "<tag> host=<Host header>" so that a test can tell
which server a request really reached and for which name.

Run inside a test namespace: python egress_upstream.py BIND_ADDR TAG CERT_FILE KEY_FILE
"""

from __future__ import annotations

import socketserver
import ssl
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def handler(tag: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: the proxy must check every request

        def do_GET(self) -> None:
            body = f"{tag} host={self.headers.get('Host', '')}\n".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            self.do_GET()

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


class Server(ThreadingHTTPServer):
    def server_bind(self) -> None:
        # HTTPServer's looks the address's name up (getfqdn): a DNS query from the test
        # namespace, routed out through the host to a resolver no test may reach; it waited
        # ~10 s per server for an answer that never came.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)


def main() -> None:
    bind, tag, cert, key = sys.argv[1:5]
    plain = Server((bind, 80), handler(tag))
    secure = Server((bind, 443), handler(tag))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    # The handshake happens in the request's thread, so a stalled client blocks no one.
    secure.socket = context.wrap_socket(secure.socket, server_side=True,
                                        do_handshake_on_connect=False)
    threading.Thread(target=plain.serve_forever, daemon=True).start()
    secure.serve_forever()


if __name__ == "__main__":
    main()
