"""Create -> first exec through the TypeScript SDK (sdk-ts/) against the Python SDK, same
server, same run.

A real `pandastack serve` subprocess (bench/api.py's `live_server`). Timed on each side: a
fresh `Sandbox.create(template="base")` then `exec(["true"])` until its result is back, the
way a user's first call goes; the kill is not timed. The TypeScript side is one long-lived
node process (sdk-ts/scripts/bench-first-exec.mjs) timing inside node, so node's own start is
not counted, as the Python interpreter's is not. The sides alternate, the order flipped every
iteration, after one untimed warm-up round each. Prints p50/p99 of both and the ratio of the
p50s (issue 20's target: the TypeScript SDK within 5 %).

Usage: python bench/sdk_ts.py [--n 20]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from api import Server, api_once, live_server
from common import line, pct

ROOT = Path(__file__).resolve().parents[1]
SDK = ROOT / "sdk-ts"
CMD = ["true"]


class NodeSide:
    """The long-lived node process of the TypeScript side."""

    def __init__(self, server: Server) -> None:
        env = {"PATH": os.environ["PATH"], "HOME": "/nonexistent",
               "PANDASTACK_API": server.api_url, "PANDASTACK_API_KEY": server.api_key,
               "BENCH_CMD": json.dumps(CMD)}
        self.proc = subprocess.Popen(["node", str(SDK / "scripts" / "bench-first-exec.mjs")],
                                     env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)

    def once(self) -> tuple[float, float]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        reply = self.proc.stdout.readline()
        if not reply:
            raise RuntimeError(f"the node side exited ({self.proc.wait()})")
        timing = json.loads(reply)
        return float(timing["created"]), float(timing["total"])

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20)
    args = parser.parse_args()
    subprocess.run(["bash", str(SDK / "scripts" / "build.sh")], check=True)
    tmp = Path(tempfile.mkdtemp(prefix="bsts-", dir="/tmp"))
    py: list[float] = []
    ts: list[float] = []
    try:
        with live_server(tmp) as server:
            node = NodeSide(server)
            try:
                api_once(server, CMD)  # warm-up, untimed
                node.once()
                for i in range(args.n):
                    for side in ("py", "ts") if i % 2 == 0 else ("ts", "py"):
                        if side == "py":
                            py.append(api_once(server, CMD)[1] * 1000)
                        else:
                            ts.append(node.once()[1] * 1000)
            finally:
                node.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(line("create -> first exec, Python SDK", py))
    print(line("create -> first exec, TypeScript SDK", ts))
    print(f"TypeScript / Python at p50: {pct(ts, 50) / pct(py, 50):.3f}  "
          f"at p99: {pct(ts, 99) / pct(py, 99):.3f}")


if __name__ == "__main__":
    main()
