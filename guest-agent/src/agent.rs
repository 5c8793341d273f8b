//! The agent: the reader (main thread) decodes frames and dispatches them; frames for an op
//! in flight go to it, new requests go to a worker thread (workers.rs); whole frames are written under
//! one lock and tagged with the connection generation (frames of an older connection are
//! dropped). The same design as the reference agent, src/pandastack/guest/agent.py.

use std::collections::HashMap;
use std::fs::File;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::channel::{self, Channel};
use crate::frame::{self, Decoder, Frame, PROTOCOL_VERSION};
use crate::json::{Obj, Value};
use crate::op::{Op, OpResult};
use crate::cgroups::{self, Cgroups};
use crate::table::ProcTable;
use crate::workers::Workers;
use crate::{code, execs, files, metrics, pty, search, sysinit, volumes, watch};

pub const AGENT_VERSION: &str = "0.1.0";

pub struct Shared {
    out: File,
    /// The current generation; its lock is also the write lock, so a frame is written
    /// whole and only if its connection is still the current one.
    gen: Mutex<u64>,
    ops: Mutex<HashMap<u64, Arc<Op>>>,
    pub procs: ProcTable,
    pub guest: bool,
    pub code_socket: String,
    workers: Arc<Workers>,
}

impl Shared {
    pub fn send(&self, header: &Value, payload: &[u8], gen: u64) -> bool {
        let data = match frame::encode(header, payload) {
            Ok(d) => d,
            Err(e) => {
                eprintln!("pandastack-agent: cannot encode frame: {}", e);
                return false;
            }
        };
        let g = self.gen.lock().unwrap_or_else(|e| e.into_inner());
        if *g != gen {
            return false;
        }
        channel::write_all(&self.out, &data).is_ok()
    }

    fn current(&self) -> u64 {
        *self.gen.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn release(&self, op: &Op) {
        let mut ops = self.ops.lock().unwrap_or_else(|e| e.into_inner());
        if ops.get(&op.id).map_or(false, |o| std::ptr::eq(Arc::as_ptr(o), op)) {
            ops.remove(&op.id);
        }
    }

    /// The host went away (or we lost sync): detach every op of this connection.
    fn disconnect(&self) {
        *self.gen.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        let ops: Vec<Arc<Op>> = self.ops.lock().unwrap_or_else(|e| e.into_inner()).drain().map(|(_, o)| o).collect();
        for op in ops {
            op.cancel(false);
        }
    }

    fn reply(&self, f: &Frame, t: &str, fields: Obj) {
        let mut kv = vec![("t".to_string(), Value::from(t)), ("id".to_string(), Value::from(f.id))];
        kv.extend(fields.0);
        self.send(&Value::Obj(kv), b"", self.current());
    }
}

pub type Handler = fn(&Arc<Shared>, &Arc<Op>, &Frame) -> OpResult;

/// Each module names the requests it answers, so a new operation is not named here too.
const MODULES: &[&[(&str, Handler)]] = &[
    sysinit::HANDLERS,
    execs::HANDLERS,
    files::HANDLERS,
    search::HANDLERS,
    code::HANDLERS,
    metrics::HANDLERS,
    pty::HANDLERS,
    volumes::HANDLERS,
    watch::HANDLERS,
];

fn handler(t: &str) -> Option<Handler> {
    MODULES.iter().flat_map(|m| m.iter()).find(|(name, _)| *name == t).map(|&(_, h)| h)
}

/// Frames that only make sense for an op in flight; late ones are dropped silently.
const STREAM_TYPES: &[&str] = &["credit", "data", "eof", "cancel", "stdin", "stdin_eof", "signal", "resize"];

pub fn run(mut chan: Channel, guest: bool, default_cwd: Option<String>, code_socket: String) -> i32 {
    let out = match chan.writer() {
        Ok(f) => f,
        Err(e) => {
            eprintln!("pandastack-agent: {}", e);
            return 1;
        }
    };
    let shared = Arc::new(Shared {
        out,
        gen: Mutex::new(0),
        ops: Mutex::new(HashMap::new()),
        procs: ProcTable::new(default_cwd, if guest { Cgroups::setup(cgroups::ROOT) } else { None }),
        guest,
        code_socket,
        workers: Arc::new(Workers::default()),
    });
    if guest {
        // Tell a host still connected to an agent that died before us that its operations
        // are gone; a thread, as the write blocks while no host is connected.
        let sh = shared.clone();
        std::thread::spawn(move || {
            let h = Obj::new().put("t", "started").put("id", 0i64).put("pid", std::process::id() as i64);
            sh.send(&h.value(), b"", 0);
        });
    }
    let mut dec = Decoder::default();
    let mut synced = false;
    let mut delay = Duration::from_millis(10);
    loop {
        let data = chan.read();
        if data.is_empty() {
            shared.disconnect();
            dec.clear();
            synced = false;
            if !chan.reconnects {
                break;
            }
            std::thread::sleep(delay); // no host connected: back off, never busy-spin
            delay = (delay * 2).min(Duration::from_millis(200));
            continue;
        }
        delay = Duration::from_millis(10);
        dec.feed(data);
        loop {
            if !synced {
                match dec.scan(|f| f.t == "hello" && f.id == 0) {
                    Some(f) => synced = hello(&shared, &f),
                    None => break,
                }
                continue;
            }
            match dec.next_frame() {
                Ok(Some(f)) => dispatch(&shared, f),
                Ok(None) => break,
                Err(e) => {
                    let h = Obj::new().put("t", "error").put("id", 0i64).put("code", "EPROTO").put("message", e);
                    shared.send(&h.value(), b"", shared.current());
                    shared.disconnect();
                    dec.skip_bad();
                    synced = false;
                }
            }
        }
    }
    if !guest {
        shared.procs.kill_all(); // test mode: leave nothing behind on the developer's host
    }
    0
}

fn hello(sh: &Arc<Shared>, f: &Frame) -> bool {
    let v = f.get("v").cloned().unwrap_or(Value::Null);
    let nonce = f.get("nonce").cloned().unwrap_or(Value::Null);
    // Python compares with ==, where True and 1.0 equal 1: so does this.
    let ok = match v {
        Value::Int(i) => i == PROTOCOL_VERSION,
        Value::Bool(b) => b,
        Value::Float(x) => x == PROTOCOL_VERSION as f64,
        _ => false,
    };
    if !ok {
        let msg = format!("protocol version {} not supported (want {})", py_repr(&v), PROTOCOL_VERSION);
        sh.reply(f, "error", Obj::new().put("code", "EPROTONOSUPPORT").put("message", msg).put("nonce", nonce));
        return false;
    }
    sh.disconnect();
    sh.reply(
        f,
        "hello",
        Obj::new()
            .put("v", PROTOCOL_VERSION as i64)
            .put("nonce", nonce)
            .put("agent_version", AGENT_VERSION)
            .put("pid", std::process::id() as i64),
    );
    true
}

/// Python's repr of a JSON value, for messages that quote what the host sent.
pub fn py_repr(v: &Value) -> String {
    match v {
        Value::Null => "None".into(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::Str(s) => format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'")),
        other => crate::json::to_string(other),
    }
}

fn dispatch(sh: &Arc<Shared>, f: Frame) {
    if f.t == "hello" {
        hello(sh, &f);
        return;
    }
    let inflight = sh.ops.lock().unwrap_or_else(|e| e.into_inner()).get(&f.id).cloned();
    if let Some(op) = inflight {
        op.on_frame(f);
        return;
    }
    if f.t == "ping" {
        sh.reply(&f, "pong", Obj::new());
        return;
    }
    let h = match handler(&f.t) {
        Some(h) => h,
        None => {
            if !STREAM_TYPES.contains(&f.t.as_str()) {
                let msg = format!("unknown request type {}", py_repr(&Value::Str(f.t.clone())));
                sh.reply(&f, "error", Obj::new().put("code", "ENOSYS").put("message", msg));
            }
            return;
        }
    };
    if f.id == 0 {
        sh.reply(&f, "error", Obj::new().put("code", "EINVAL").put("message", "id 0 is reserved for hello"));
        return;
    }
    let op = Arc::new(Op::new(&f, sh.current(), sh.clone()));
    if f.t == "init" {
        // Inline in the reader: every request after it must see the new clock, RNG and
        // identity, so nothing may overtake it.
        run_op(sh, &op, h, &f);
        return;
    }
    sh.ops.lock().unwrap_or_else(|e| e.into_inner()).insert(op.id, op.clone());
    let (sh0, gen) = (sh.clone(), op.gen);
    let f0 = Frame { header: Value::Null, payload: Vec::new(), t: f.t.clone(), id: f.id };
    let sh = sh.clone();
    let workers = sh.workers.clone();
    let spawned = workers.run(Box::new(move || {
        run_op(&sh, &op, h, &f);
        if !op.keep.load(std::sync::atomic::Ordering::SeqCst) {
            sh.release(&op);
        }
    }));
    if let Err(e) = spawned {
        // The job went with the error: answer for its op here.
        let op = Op::new(&f0, gen, sh0.clone());
        sh0.release(&op);
        sh0.ops.lock().unwrap_or_else(|e| e.into_inner()).remove(&f0.id);
        op.send("error", b"", Obj::new().put("code", "EAGAIN").put("message", format!("cannot start a worker: {}", e)));
    }
}

fn run_op(sh: &Arc<Shared>, op: &Arc<Op>, h: Handler, f: &Frame) {
    if let Err(e) = h(sh, op, f) {
        let mut o = Obj::new().put("code", e.code).put("message", e.message);
        if let Some(p) = e.path {
            o = o.put("path", p);
        }
        op.send("error", b"", o);
    }
}

