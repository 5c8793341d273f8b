// E2B's JavaScript SDK over TLS, for tests/e2e/test_tls_serve.py: over_tls.py's steps (one
// sandbox through E2B_API_URL and E2B_SANDBOX_URL, `serve`'s own TLS; then through the nginx in
// front, whose URLs are the arguments; killed there). The CA comes only from what a user sets
// (NODE_EXTRA_CA_CERTS). Prints one JSON object: what each way saw.
//
//   node over_tls.mjs PROXY_API_URL PROXY_SANDBOX_URL
import { createHash } from 'node:crypto'
import { Sandbox } from 'e2b'

const [proxyApi, proxySandbox] = process.argv.slice(2)
// Over nginx's default body limit (1 MiB): the guide's `client_max_body_size 0` is needed.
const payload = new Uint8Array(256 * 8192).map((_, i) => i % 256)
const sha256 = (bytes) => createHash('sha256').update(bytes).digest('hex')

async function exercise(sbx, way) {
  const ran = await sbx.commands.run(`echo ${way} $((6*7))`)
  await sbx.files.write(`/tmp/${way}.bin`, payload.buffer)
  const back = await sbx.files.read(`/tmp/${way}.bin`, { format: 'bytes' })
  return { stdout: ran.stdout, exit: ran.exitCode, read_sha256: sha256(back) }
}

const seen = { payload_sha256: sha256(payload) }
const sbx = await Sandbox.create('base', { timeoutMs: 300_000 })
seen.id = sbx.sandboxId
try {
  seen.direct = await exercise(sbx, 'direct')
  const again = await Sandbox.connect(sbx.sandboxId, { apiUrl: proxyApi, sandboxUrl: proxySandbox })
  seen.proxy = await exercise(again, 'proxy')
  seen.killed = await again.kill()
} finally {
  if (!('killed' in seen)) await sbx.kill()
}
console.log(JSON.stringify(seen))
