// The TypeScript side of bench/sdk_ts.py: a long-lived process (so node's start is not
// timed, as the Python side's interpreter start is not) that, for each line on stdin, times
// Sandbox.create() then exec(argv) until its result is back, kills the sandbox untimed, and
// prints {"created": s, "total": s} on a line. Server and key come from the environment.
import { createInterface } from "node:readline";
import { Sandbox } from "../dist/src/index.js";

const argv = JSON.parse(process.env.BENCH_CMD ?? '["true"]');
for await (const _ of createInterface({ input: process.stdin })) {
  const started = performance.now();
  const sbx = await Sandbox.create({ template: "base", ttlSeconds: 300 });
  const created = performance.now();
  let total;
  try {
    const run = await sbx.exec(argv);
    total = performance.now();
    if (run.exitCode !== 0) throw new Error(`exit ${run.exitCode}: ${run.stderr}`);
  } finally {
    await sbx.kill();
  }
  process.stdout.write(JSON.stringify({ created: (created - started) / 1000, total: (total - started) / 1000 }) + "\n");
}
