"""Javascript contexts: one persistent `node` process each, running NODE_RUNNER."""

from __future__ import annotations

import codecs
import json
import secrets
import time
from typing import Any

from .protocol import Run
from .shell import ProcessContext

# --- javascript ----------------------------------------------------------------------------

NODE_RUNNER = r"""
'use strict';
const vm = require('vm');
const util = require('util');
const readline = require('readline');
const write = process.stdout.write.bind(process.stdout);
let token = null;
const send = (o) => { o.token = token; write(JSON.stringify(o) + '\n'); };
const fmt = (args) => util.formatWithOptions({ colors: false }, ...args) + '\n';
const stream = (t) => (chunk, enc, cb) => {
  send({ t, text: typeof chunk === 'string' ? chunk : Buffer.from(chunk).toString() });
  const done = typeof enc === 'function' ? enc : cb;
  if (typeof done === 'function') done();
  return true;
};
process.stdout.write = stream('stdout');
process.stderr.write = stream('stderr');
const out = (...a) => send({ t: 'stdout', text: fmt(a) });
const err = (...a) => send({ t: 'stderr', text: fmt(a) });
const con = { log: out, info: out, debug: out, dir: out, error: err, warn: err, trace: err };
process.on('uncaughtException', (e) => send({ t: 'stderr', text: String(e && e.stack || e) }));
process.on('unhandledRejection', (e) => send({ t: 'stderr', text: String(e && e.stack || e) }));
const ctx = vm.createContext({
  console: con, require, process, Buffer, URL, URLSearchParams, TextEncoder, TextDecoder,
  setTimeout, clearTimeout, setInterval, clearInterval, setImmediate, clearImmediate,
  queueMicrotask, structuredClone, fetch: globalThis.fetch,
});
let n = 0;
const within = (p, ms) => ms ? Promise.race([p, new Promise((_, rej) => setTimeout(() => {
  const e = new Error(`Promise not settled after ${ms} ms`); e.name = 'TimeoutError'; rej(e);
}, ms))]) : p;
// The runner's own frames (vm, this file) say nothing about the user's code.
const cellFrames = (stack) => {
  const lines = stack.split('\n');
  const cut = lines.findIndex((l) => l.includes('runInContext') || l.includes('[eval]'));
  return (cut > 0 ? lines.slice(0, cut) : lines).join('\n');
};
async function run(req) {
  token = req.token;
  const started = Date.now();
  const saved = {};  // per-run variables: restored afterwards
  for (const [k, v] of Object.entries(req.env || {})) {
    saved[k] = process.env[k];
    process.env[k] = v;
  }
  try {
    const script = new vm.Script(req.code, { filename: `<cell ${++n}>` });
    let value = script.runInContext(ctx, { timeout: req.timeout_ms || undefined,
                                           displayErrors: false });
    if (value && typeof value.then === 'function') {
      const left = req.timeout_ms ? Math.max(1, req.timeout_ms - (Date.now() - started)) : 0;
      value = await within(value, left);
    }
    if (value !== undefined) {
      send({ t: 'result', text: util.inspect(value, { colors: false, depth: 4 }) });
    }
  } catch (e) {
    const timedOut = e && e.code === 'ERR_SCRIPT_EXECUTION_TIMEOUT';
    const isObj = e !== null && typeof e === 'object';
    send({ t: 'error', name: timedOut ? 'TimeoutError' : String(isObj && e.name || 'Error'),
           value: String(isObj && e.message !== undefined ? e.message : e),
           traceback: timedOut ? '' : cellFrames(String(isObj && e.stack || e)) });
  } finally {
    for (const [k, v] of Object.entries(saved)) {
      if (v === undefined) delete process.env[k]; else process.env[k] = v;
    }
  }
  send({ t: 'end', count: n });
}
let chain = Promise.resolve();
readline.createInterface({ input: process.stdin, terminal: false }).on('line', (line) => {
  chain = chain.then(() => run(JSON.parse(line)));
});
"""


class NodeContext(ProcessContext):
    language = "javascript"

    def __init__(self, ctx_id: str, cwd: str) -> None:
        super().__init__(ctx_id, cwd)
        self.partial = bytearray()

    def argv(self) -> list[str]:
        return ["node", "-e", NODE_RUNNER]

    async def start(self) -> None:
        self.partial = bytearray()
        await super().start()

    async def execute(self, code: str, run: Run, env: dict[str, str] | None,
                      store_history: bool) -> int | None:
        proc = await self._ensure()
        assert proc.stdin is not None
        token = secrets.token_hex(8)
        req: dict[str, Any] = {"code": code, "token": token}
        if run.timeout is not None:
            req["timeout_ms"] = max(1, int(run.timeout * 1000))
        if env:
            req["env"] = env
        count, reason = await self._exchange(
            proc, json.dumps(req).encode() + b"\n", lambda: self._collect(token, run))
        if reason is not None:
            await self.stop()
            await run.stopped(reason, "; node did not stop and was restarted: its state is lost")
        elif count is None:
            await self.stop()
            await run.out.error("ExitError", "node exited; a new one starts with the next run: "
                                "its state is lost")
        return count

    async def _collect(self, token: str, run: Run) -> tuple[int | None, str | None]:
        reason: str | None = None
        stopped_at = 0.0
        stderr = codecs.getincrementaldecoder("utf-8")("replace")
        while True:
            if reason is None:
                reason = run.stop_reason()
                # node enforces the timeout itself (vm timeout); this is the backstop.
                if reason == "timeout":
                    reason = None if time.monotonic() < (run.deadline or 0) + 5 else reason
                if reason is not None:
                    stopped_at = time.monotonic()
            elif time.monotonic() - stopped_at > 1.0:
                return None, reason
            item = await self._next()
            if item is None:
                continue
            name, data = item
            if not data:
                if name == "stdout":
                    return None, reason
                continue
            if name == "stderr":  # node's own messages (the runner sends everything else)
                await run.out.text("stderr", stderr.decode(data))
                continue
            self.partial += data
            while (nl := self.partial.find(b"\n")) >= 0:
                line, self.partial = bytes(self.partial[:nl]), self.partial[nl + 1:]
                try:
                    ev = json.loads(line)
                except (ValueError, RecursionError):
                    continue
                if not isinstance(ev, dict) or ev.get("token") != token:
                    continue  # a timer of an earlier run
                t = ev.get("t")
                if t in ("stdout", "stderr"):
                    await run.out.text(t, str(ev.get("text", "")))
                elif t == "result":
                    await run.out.result({"text/plain": str(ev.get("text", ""))}, True)
                elif t == "error":
                    await run.out.error(str(ev.get("name", "Error")), str(ev.get("value", "")),
                                        str(ev.get("traceback", "")))
                elif t == "end":
                    count = ev.get("count")
                    return (count if isinstance(count, int) else 0), None
