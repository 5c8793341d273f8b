// E2B's JavaScript SDK (e2b, @e2b/code-interpreter) against pandastack: py_sync.py's steps in
// one sandbox of the code interpreter's template, each step's outcome a JSON line in the report
// file. tests/e2e/test_e2b_sdk_versions.py runs it beside the node_modules of
// scripts/e2b-sdks.sh (E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY set).
//
//   node js_sdk.mjs REPORT_FILE RUN_ID
import { appendFileSync, writeFileSync } from 'node:fs'
import { CommandExitError } from 'e2b'
import { Sandbox } from '@e2b/code-interpreter'

const [reportPath, runId] = process.argv.slice(2)
const metadata = { suite: 'e2b-sdk-versions', run: runId }
const failed = new Set()
const made = [] // every sandbox a step made: the test checks each has ended after the script
writeFileSync(reportPath, '')

function record(step, ok, error = '', detail = {}) {
  appendFileSync(reportPath, JSON.stringify({ step, ok, error, ...detail }) + '\n')
}

function check(cond, what) {
  if (!cond) throw new Error(`assertion failed: ${typeof what === 'string' ? what : JSON.stringify(what)}`)
}

async function step(name, body, needs = ['create']) {
  const missing = needs.filter((n) => failed.has(n))
  if (missing.length) {
    failed.add(name)
    record(name, false, `not run: ${missing.join(', ')} failed`)
    return
  }
  const started = performance.now()
  try {
    await body()
    record(name, true, '', { seconds: Math.round(performance.now() - started) / 1000 })
  } catch (e) {
    failed.add(name)
    const first = String(e?.message ?? e).trim().split('\n')[0]
    const where = (String(e?.stack ?? '').split('\n').find((l) => l.includes('js_sdk.mjs')) ?? '').trim()
    record(name, false, `${e?.name ?? 'Error'}: ${first}`.slice(0, 2000), { where })
  } finally {
    if (made.length) record('_made', true, '', { sandboxes: made.splice(0) })
  }
}

async function until(done, what, seconds = 30) {
  const deadline = performance.now() + seconds * 1000
  while (!done()) {
    if (performance.now() > deadline) throw new Error(`no ${what} in ${seconds} s`)
    await new Promise((resolve) => setTimeout(resolve, 50))
  }
}

async function exitOf(promise) {
  try {
    await promise
    return { exitCode: 0 }
  } catch (e) {
    if (e instanceof CommandExitError) return e
    throw e
  }
}

const BROKEN = "import json\nprint(json.dumps({'answer': 6 * 7})\n"
const FIXED = "import json\nprint(json.dumps({'answer': 6 * 7}))\n"
const TICKS = 'for i in 1 2 3; do echo tick $i; sleep 0.2; done; sleep 300'
let sbx
let sleeper

await step('create', async () => {
  sbx = await Sandbox.create({ timeoutMs: 300_000, metadata })
  made.push(sbx.sandboxId)
}, [])

try {
  await step('agent_loop', async () => {
    await sbx.files.write('/home/user/step.py', BROKEN)
    const broken = await exitOf(sbx.commands.run('python3 /home/user/step.py'))
    check(broken.exitCode === 1, { exitCode: broken.exitCode })
    check(broken.stderr.includes('SyntaxError'), broken.stderr)
    await sbx.files.write('/home/user/step.py', FIXED)
    const fixed = await sbx.commands.run('python3 /home/user/step.py')
    check(fixed.exitCode === 0 && fixed.stdout === '{"answer": 42}\n', fixed)
  })

  await step('commands', async () => {
    const who = await sbx.commands.run('whoami; pwd')
    check(who.stdout === 'user\n/home/user\n', who.stdout)
    const root = await sbx.commands.run('whoami', { user: 'root' })
    check(root.stdout === 'root\n', root.stdout)
    const three = await exitOf(sbx.commands.run('echo out; echo err >&2; exit 3'))
    check(three.exitCode === 3 && three.stdout === 'out\n' && three.stderr === 'err\n',
      { exitCode: three.exitCode, stdout: three.stdout, stderr: three.stderr })
    const env = await sbx.commands.run('echo $GREETING', { envs: { GREETING: 'hi' }, cwd: '/tmp' })
    check(env.stdout === 'hi\n', env.stdout)
  })

  await step('background', async () => {
    let seen = ''
    let gotThree
    const three = new Promise((resolve) => { gotThree = resolve })
    const handle = await sbx.commands.run(TICKS, {
      background: true,
      onStdout: (chunk) => {
        seen += chunk
        if ((seen.match(/tick/g) ?? []).length >= 3) gotThree()
      },
    })
    // The ticks arrive while the command still runs (it sleeps 300 s after them).
    let timer
    const late = new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Error(`no 3 ticks in 60 s: ${JSON.stringify(seen)}`)), 60_000)
    })
    await Promise.race([three, late]).finally(() => clearTimeout(timer))
    check(seen === 'tick 1\ntick 2\ntick 3\n', seen)
    const listed = (await sbx.commands.list()).map((p) => p.pid)
    check(listed.includes(handle.pid), { pid: handle.pid, listed })
    check((await sbx.commands.kill(handle.pid)) === true, 'kill answered true')
    const ended = await exitOf(handle.wait())
    check(ended.exitCode !== 0, { exitCode: ended.exitCode })
    check(!(await sbx.commands.list()).map((p) => p.pid).includes(handle.pid), 'gone from the list')
  })

  await step('files', async () => {
    check((await sbx.files.makeDir('/home/user/d/sub')) === true, 'makeDir made it')
    await sbx.files.write('/home/user/d/a.txt', 'alpha')
    await sbx.files.write('/home/user/d/b.bin', new Uint8Array([0, 1, 255]).buffer)
    check((await sbx.files.read('/home/user/d/a.txt')) === 'alpha', 'text read back')
    const bytes = await sbx.files.read('/home/user/d/b.bin', { format: 'bytes' })
    check(Buffer.from(bytes).equals(Buffer.from([0, 1, 255])), [...bytes])
    const names = (await sbx.files.list('/home/user/d')).map((e) => e.name).sort()
    check(JSON.stringify(names) === '["a.txt","b.bin","sub"]', names)
    check(await sbx.files.exists('/home/user/d/a.txt'), 'a.txt exists')
    const moved = await sbx.files.rename('/home/user/d/a.txt', '/home/user/d/sub/c.txt')
    check(moved.path === '/home/user/d/sub/c.txt', moved)
    check(!(await sbx.files.exists('/home/user/d/a.txt')), 'a.txt moved away')
    check((await sbx.files.read('/home/user/d/sub/c.txt')) === 'alpha', 'moved file read')
    await sbx.files.remove('/home/user/d/sub')
    check(!(await sbx.files.exists('/home/user/d/sub/c.txt')), 'removed')
    const owner = await sbx.commands.run('stat -c %U /home/user/d/b.bin')
    check(owner.stdout === 'user\n', owner.stdout)
  })

  await step('stdin_reconnect', async () => {
    let firstOut = ''
    const first = await sbx.commands.run('cat', {
      background: true, stdin: true, onStdout: (d) => { firstOut += d },
    })
    await sbx.commands.sendStdin(first.pid, 'one\n')
    await until(() => firstOut.includes('one\n'), 'one echoed')
    check(firstOut === 'one\n', firstOut)
    await first.disconnect()
    let againOut = ''
    const again = await sbx.commands.connect(first.pid, { onStdout: (d) => { againOut += d } })
    await sbx.commands.sendStdin(first.pid, 'two\n')
    await until(() => againOut.includes('two\n'), 'two echoed')
    // Ours replays the output the guest holds first (envd/process.py), where E2B's daemon
    // sends only what comes after.
    check(againOut === 'two\n' || againOut === 'one\ntwo\n', againOut)
    await sbx.commands.closeStdin(first.pid)
    check((await again.wait()).exitCode === 0, 'cat exits 0 after stdin closes')
  })

  await step('watch', async () => {
    await sbx.files.makeDir('/home/user/w')
    const names = []
    const handle = await sbx.files.watchDir('/home/user/w', (e) => { names.push(e.name) })
    await sbx.files.write('/home/user/w/new.txt', 'x')
    await until(() => names.includes('new.txt'), 'a watch event for new.txt')
    await handle.stop()
  })

  await step('pty', async () => {
    let seen = ''
    const decoder = new TextDecoder()
    const term = await sbx.pty.create({
      cols: 80, rows: 24, onData: (d) => { seen += decoder.decode(d, { stream: true }) },
    })
    const encoder = new TextEncoder()
    await sbx.pty.sendInput(term.pid, encoder.encode('echo pty-$((6*7))\n'))
    await until(() => seen.includes('pty-42'), 'pty-42 on the terminal')
    await sbx.pty.resize(term.pid, { cols: 100, rows: 30 })
    await sbx.pty.sendInput(term.pid, encoder.encode('stty size; exit 3\n'))
    const ended = await exitOf(term.wait())
    check(ended.exitCode === 3, { exitCode: ended.exitCode })
    check(seen.includes('30 100'), seen)
  })

  await step('run_code', async () => {
    const first = await sbx.runCode('x = 41')
    check(first.error === undefined, first.error ?? '')
    const second = await sbx.runCode('x + 1')
    check(second.text === '42', second.toJSON())
    const printed = await sbx.runCode("print('hello')")
    check(JSON.stringify(printed.logs.stdout) === '["hello\\n"]', printed.logs)
    const failing = await sbx.runCode('1 / 0')
    check(failing.error?.name === 'ZeroDivisionError', failing.toJSON())
  })

  await step('png', async () => {
    const drawn = await sbx.runCode('import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()')
    const png = drawn.results.find((r) => r.png)?.png
    check(png && Buffer.from(png, 'base64').subarray(0, 4).equals(Buffer.from([0x89, 0x50, 0x4e, 0x47])),
      drawn.toJSON())
  })

  await step('fork', async () => {
    await sbx.files.write('/home/user/forked.txt', 'from the parent')
    const kids = await sbx.fork({ count: 1 })
    try {
      check(kids.length === 1 && !(kids[0] instanceof Error), String(kids[0]))
      const kid = kids[0]
      made.push(kid.sandboxId)
      check(kid.sandboxId !== sbx.sandboxId, 'a new id')
      check((await kid.files.read('/home/user/forked.txt')) === 'from the parent', 'the parent\'s file')
      await kid.files.write('/home/user/forked.txt', 'from the child')
      check((await sbx.files.read('/home/user/forked.txt')) === 'from the parent', 'the parent unchanged')
    } finally {
      for (const kid of kids) if (!(kid instanceof Error)) await kid.kill()
    }
  })

  await step('list_metadata', async () => {
    const found = await Sandbox.list({ query: { metadata } }).nextItems()
    check(JSON.stringify(found.map((s) => s.sandboxId)) === JSON.stringify([sbx.sandboxId]), found)
    const other = await Sandbox.list({ query: { metadata: { run: `none-${runId}` } } }).nextItems()
    check(other.length === 0, other)
  })

  await step('timeout', async () => {
    const before = (await sbx.getInfo()).endAt
    const asked = Date.now()
    await sbx.setTimeout(1_200_000)
    const answered = Date.now()
    const after = (await sbx.getInfo()).endAt
    // 1200 s from the call (server and client share this machine's clock); measured from the
    // create's 300 s the move depends on how long the steps before took.
    check(after - asked > 1_140_000 && after - answered < 1_260_000, { asked, before, after })
  })

  await step('pause_resume', async () => {
    await sbx.files.write('/home/user/keep.txt', 'kept')
    sleeper = await sbx.commands.run('sleep 600', { background: true })
    check((await sbx.pause()) === true, 'pause answered true')
    check((await Sandbox.getInfo(sbx.sandboxId)).state === 'paused', 'paused')
    const resumed = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 300_000 })
    check((await resumed.files.read('/home/user/keep.txt')) === 'kept', 'file kept')
    // Hibernation keeps memory: the process started before the pause still runs.
    const pids = (await resumed.commands.list()).map((p) => p.pid)
    check(pids.includes(sleeper.pid), { pid: sleeper.pid, pids })
    check((await resumed.commands.run('echo back')).stdout === 'back\n', 'runs after resume')
    check((await Sandbox.getInfo(sbx.sandboxId)).state === 'running', 'running again')
  })

  await step('kill', async () => {
    check((await sbx.kill()) === true, 'kill answered true')
    const left = await Sandbox.list({ query: { metadata } }).nextItems()
    check(left.length === 0, left)
  })

  await step('gone', async () => {
    // The stream of a command that was running when its sandbox was killed ends (else node
    // would wait for it before exiting).
    let timer
    const late = new Promise((resolve) => { timer = setTimeout(() => resolve('open'), 30_000) })
    const ended = sleeper.wait().then(() => 'ended', () => 'ended')
    check((await Promise.race([ended, late]).finally(() => clearTimeout(timer))) === 'ended',
      'the killed sandbox\'s command stream still open after 30 s')
    check(!(await sbx.isRunning()), 'not running')
  }, ['kill', 'pause_resume'])
} finally {
  // The kill step reports its own outcome; this only cleans up after a failure.
  if (sbx) await sbx.kill().catch(() => {})
}
