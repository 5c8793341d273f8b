//! Process operations: exec, spawn, spawn_attach, attach, procs, signal, stdin, stdin_eof.

use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::agent::{py_repr, Handler, Shared};
use crate::frame::Frame;
use crate::json::{self, Obj, Value};
use crate::op::{arg_bool, arg_int, arg_opt_int, arg_opt_str, Op, OpError, OpResult};
use crate::procs::{ExitInfo, Proc, Sink, Stream};
use crate::table::Spec;
use crate::sys;
use crate::users;

/// The requests this module answers (agent.rs's dispatch table is made of these).
pub const HANDLERS: &[(&str, Handler)] = &[
    ("exec", exec),
    ("spawn", spawn),
    ("spawn_attach", spawn_attach),
    ("attach", attach),
    ("procs", procs),
    ("signal", signal),
    ("stdin", stdin),
    ("stdin_eof", stdin_eof),
];

const MAX_PROC_LIST: usize = 900 * 1024;

/// Delivers a process's output as `stdout`/`stderr` frames of one op, then `exit`. Its
/// lock is held across a whole delivery (and by attach across the backlog).
pub struct WireSink {
    op: Arc<Op>,
    closed: Mutex<bool>,
    /// Called after the exit went out (a terminal's attachment ends its keystroke writer).
    after: Option<Box<dyn Fn() + Send + Sync>>,
}

impl WireSink {
    pub fn new(op: Arc<Op>, after: Option<Box<dyn Fn() + Send + Sync>>) -> WireSink {
        WireSink { op, closed: Mutex::new(false), after }
    }
    /// Held while a backlog is sent, so live output cannot overtake it.
    pub fn hold(&self) -> std::sync::MutexGuard<'_, bool> {
        self.closed.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Sink for WireSink {
    fn closed(&self) -> bool {
        *self.closed.lock().unwrap_or_else(|e| e.into_inner()) || self.op.is_cancelled()
    }
    fn deliver(&self, stream: Stream, data: &[u8]) {
        let mut c = self.closed.lock().unwrap_or_else(|e| e.into_inner());
        if !*c && !self.op.is_cancelled() && !self.op.send_data(stream.name(), data) {
            *c = true;
        }
    }
    fn finish(&self, info: &ExitInfo) {
        {
            let mut c = self.closed.lock().unwrap_or_else(|e| e.into_inner());
            if !*c && !self.op.is_cancelled() {
                self.op.send("exit", b"", info.fields());
            }
            *c = true;
        }
        self.op.release();
        if let Some(f) = &self.after {
            f();
        }
    }
}

/// Python's shlex.join: what `procs` shows for an argv.
fn shlex_join(argv: &[String]) -> String {
    argv.iter()
        .map(|a| {
            let safe = !a.is_empty()
                && a.bytes().all(|c| c.is_ascii_alphanumeric() || b"@%+=:,./-_".contains(&c));
            if safe {
                a.clone()
            } else {
                format!("'{}'", a.replace('\'', "'\"'\"'"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

pub fn command(h: &Value) -> Result<(Vec<String>, String), OpError> {
    if let Some(argv) = h.get("argv").filter(|v| !v.is_null()) {
        let list: Option<Vec<String>> = match argv {
            Value::Arr(items) if !items.is_empty() => items
                .iter()
                .map(|a| a.as_str().filter(|s| !s.contains('\0')).map(str::to_string))
                .collect(),
            _ => None,
        };
        return match list {
            Some(l) => {
                let d = shlex_join(&l);
                Ok((l, d))
            }
            None => Err(OpError::inval("'argv' must be a non-empty list of strings")),
        };
    }
    match h.get("cmd").and_then(Value::as_str) {
        Some(c) if !c.is_empty() && !c.contains('\0') => {
            Ok((vec!["/bin/sh".into(), "-c".into(), c.to_string()], c.to_string()))
        }
        _ => Err(OpError::inval("need 'cmd' (non-empty string) or 'argv' (list of strings)")),
    }
}

pub fn env(h: &Value) -> Result<Option<Vec<(String, String)>>, OpError> {
    let bad = || OpError::inval("'env' must map names to strings");
    match h.get("env") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Obj(kv)) => {
            let mut out: Vec<(String, String)> = Vec::new();
            for (k, v) in kv {
                let v = v.as_str().ok_or_else(bad)?;
                if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
                    return Err(bad());
                }
                match out.iter_mut().find(|(ok, _)| ok == k) {
                    Some(e) => e.1 = v.to_string(),
                    None => out.push((k.clone(), v.to_string())),
                }
            }
            Ok(Some(out))
        }
        Some(_) => Err(bad()),
    }
}

pub fn user(h: &Value) -> Result<Option<users::User>, OpError> {
    match arg_opt_str(h, "user")? {
        None => Ok(None),
        Some(spec) => users::lookup(&spec, |s| py_repr(&Value::Str(s.to_string())))
            .map(Some)
            .map_err(|why| OpError::inval(&why)),
    }
}

/// A bad cwd is an error reply, a missing program an exit code: std reports both the same
/// way from the child, so the cwd is checked first.
pub fn check_cwd(cwd: &Option<String>) -> Result<(), OpError> {
    if let Some(c) = cwd {
        match std::fs::metadata(c) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(OpError::io(&std::io::Error::from_raw_os_error(20), Some(c))),
            Err(e) => return Err(OpError::io(&e, Some(c))),
        }
    }
    Ok(())
}

enum Started {
    Proc(Arc<Proc>),
    /// A program that cannot be run: (exit code, message) as the shell would say it.
    Failed(i32, String),
}

fn start(sh: &Arc<Shared>, h: &Value, background: bool, stdin: bool) -> Result<Started, OpError> {
    let (argv, display) = command(h)?;
    let cwd = arg_opt_str(h, "cwd")?;
    let timeout_ms = arg_opt_int(h, "timeout_ms", 1)?;
    let user = user(h)?;
    let env = env(h)?;
    check_cwd(&cwd)?;
    let spec = Spec {
        argv: &argv,
        display,
        env,
        cwd,
        stdin,
        background,
        timeout: timeout_ms.map(|ms| Duration::from_millis(ms.min(u64::MAX as i128) as u64)),
        user,
        tty: None,
    };
    match sh.procs.start(spec) {
        Ok(p) => Ok(Started::Proc(p)),
        Err(e) => {
            let code = if e.raw_os_error() == Some(2) { 127 } else { 126 };
            let why = if code == 127 {
                "command not found".to_string()
            } else {
                e.raw_os_error().map(sys::strerror_text).unwrap_or_else(|| "cannot execute".into())
            };
            Ok(Started::Failed(code, format!("pandastack-agent: {}: {}\n", argv[0], why)))
        }
    }
}

pub fn exec(sh: &Arc<Shared>, op: &Arc<Op>, f: &Frame) -> OpResult {
    let want_stdin = arg_bool(&f.header, "stdin", false)?;
    let proc = match start(sh, &f.header, false, want_stdin)? {
        Started::Failed(code, msg) => {
            op.send_data("stderr", msg.as_bytes());
            let info = ExitInfo { code, signal: None, timed_out: false, duration_ms: 0.0 };
            op.send("exit", b"", info.fields());
            return Ok(());
        }
        Started::Proc(p) => p,
    };
    proc.add_sink(Arc::new(WireSink::new(op.clone(), None)));
    let (tx, rx) = mpsc::channel::<Option<Vec<u8>>>();
    let tx = Arc::new(Mutex::new(tx));
    let (p1, tx1) = (proc.clone(), tx.clone());
    let on_frame = Box::new(move |fr: &Frame| match fr.t.as_str() {
        "stdin" => {
            let _ = tx1.lock().unwrap_or_else(|e| e.into_inner()).send(Some(fr.payload.clone()));
        }
        "stdin_eof" => {
            let _ = tx1.lock().unwrap_or_else(|e| e.into_inner()).send(None);
        }
        "signal" => {
            if let Some(sig) = fr.get("sig").and_then(Value::as_int) {
                if sig > 0 && sig < 65 {
                    p1.kill_tree(sig as i32);
                }
            }
        }
        _ => {}
    });
    let (p2, tx2, sh2) = (proc.clone(), tx.clone(), sh.clone());
    let on_cancel = Arc::new(move |o: &Op| {
        let _ = tx2.lock().unwrap_or_else(|e| e.into_inner()).send(None);
        if o.explicit_cancel() {
            p2.kill_tree(sys::SIGKILL);
        } else {
            sh2.procs.to_background(&p2);
        }
    });
    op.set_handlers(on_frame, on_cancel);
    if want_stdin {
        let (op3, p3) = (op.clone(), proc.clone());
        let _ = std::thread::Builder::new().stack_size(64 * 1024).spawn(move || {
            let mut broken = false;
            while let Ok(Some(data)) = rx.recv() {
                // The process closed stdin or exited: drop the rest, keep granting.
                if !broken && p3.write_stdin(&data).is_err() {
                    broken = true;
                }
                op3.consumed(data.len() as u64);
            }
            p3.close_stdin();
        });
    }
    proc.run_io(&sh.procs);
    let _ = tx.lock().unwrap_or_else(|e| e.into_inner()).send(None);
    Ok(())
}

pub fn spawn(sh: &Arc<Shared>, op: &Arc<Op>, f: &Frame) -> OpResult {
    let stdin = arg_bool(&f.header, "stdin", true)?;
    match start(sh, &f.header, true, stdin)? {
        Started::Failed(code, msg) => Err(OpError::new(if code == 127 { "ENOENT" } else { "EACCES" }, msg.trim())),
        Started::Proc(p) => {
            op.send("spawned", b"", Obj::new().put("pid", p.pid));
            let sh = sh.clone();
            let _ = std::thread::Builder::new().stack_size(128 * 1024).spawn(move || p.run_io(&sh.procs));
            Ok(())
        }
    }
}

/// A background process, as `spawn` starts one, followed on this op as `attach` follows one:
/// its pid first, then its output, then its exit. One round trip where a client that needs
/// the pid before the output would otherwise make two; leaving the op only detaches.
pub fn spawn_attach(sh: &Arc<Shared>, op: &Arc<Op>, f: &Frame) -> OpResult {
    let stdin = arg_bool(&f.header, "stdin", true)?;
    match start(sh, &f.header, true, stdin)? {
        Started::Failed(code, msg) => Err(OpError::new(if code == 127 { "ENOENT" } else { "EACCES" }, msg.trim())),
        Started::Proc(p) => {
            // Its output loop has not run yet: the sink sees every byte, so no backlog.
            p.add_sink(Arc::new(WireSink::new(op.clone(), None)));
            op.set_handlers(Box::new(|_| {}), Arc::new(|o: &Op| o.release()));
            op.keep.store(true, Ordering::SeqCst);
            op.send("attached", b"", Obj::new().put("pid", p.pid));
            p.run_io(&sh.procs);
            Ok(())
        }
    }
}

pub fn managed(sh: &Arc<Shared>, h: &Value) -> Result<Arc<Proc>, OpError> {
    let pid = arg_int(h, "pid", None, 1)?;
    if pid > i32::MAX as i128 {
        // Not quoted: a host may send more digits than an i128 holds (execs.py does the same).
        return Err(OpError::new("ESRCH", "no managed process (pid out of range)"));
    }
    sh.procs.get(pid).ok_or_else(|| OpError::new("ESRCH", &format!("no managed process {}", pid)))
}

pub fn attach(sh: &Arc<Shared>, op: &Arc<Op>, f: &Frame) -> OpResult {
    let proc = managed(sh, &f.header)?;
    let sink = Arc::new(WireSink::new(op.clone(), None));
    op.set_handlers(Box::new(|_| {}), Arc::new(|o: &Op| o.release()));
    let _held = sink.hold();
    let b = proc.attach(sink.clone());
    if b.info.is_none() {
        op.keep.store(true, Ordering::SeqCst);
    }
    // First, so a client can tell a complete backlog from one the ring cut short.
    op.send("replay", b"", Obj::new().put("stdout_dropped", b.dropped[0]).put("stderr_dropped", b.dropped[1]));
    if !b.out.is_empty() && !op.send_data("stdout", &b.out) {
        return Ok(());
    }
    if !b.err.is_empty() && !op.send_data("stderr", &b.err) {
        return Ok(());
    }
    if let Some(info) = b.info {
        op.send("exit", b"", info.fields());
    }
    Ok(())
}

pub fn procs(sh: &Arc<Shared>, op: &Arc<Op>, _f: &Frame) -> OpResult {
    let mut items: Vec<Value> = sh.procs.list().iter().map(|p| p.describe()).collect();
    let mut data = json::to_string(&Value::Arr(items.clone()));
    while data.len() > MAX_PROC_LIST && !items.is_empty() {
        items.drain(..items.len() / 4 + 1);
        data = json::to_string(&Value::Arr(items.clone()));
    }
    op.send("proc_list", data.as_bytes(), Obj::new().put("count", items.len()));
    Ok(())
}

pub fn signal(sh: &Arc<Shared>, op: &Arc<Op>, f: &Frame) -> OpResult {
    let pid = arg_int(&f.header, "pid", None, 1)?;
    let sig = arg_int(&f.header, "sig", None, 0)?;
    if sig > 64 {
        return Err(OpError::inval("'sig' out of range"));
    }
    match sh.procs.get(pid) {
        Some(p) => {
            if p.info().is_none() || sig == sys::SIGKILL as i128 {
                p.kill_tree(sig as i32);
            }
        }
        None => {
            if pid > i32::MAX as i128 {
                return Err(OpError::new("ESRCH", "No such process"));
            }
            sys::kill_pid(pid as i32, sig as i32).map_err(|e| OpError::io(&e, None))?;
        }
    }
    op.send("ok", b"", Obj::new());
    Ok(())
}

/// A `stdin` by pid waits this long for the process to make room in its pipe (the host's
/// answer deadline for the request is longer), then answers EAGAIN.
const STDIN_WAIT: Duration = Duration::from_secs(10);

pub fn stdin(sh: &Arc<Shared>, op: &Arc<Op>, f: &Frame) -> OpResult {
    let proc = managed(sh, &f.header)?;
    if !f.payload.is_empty() {
        proc.write_stdin_within(&f.payload, STDIN_WAIT)
            .map_err(|(n, msg)| OpError::new(sys::errno_name(n), &msg))?;
    }
    op.send("ok", b"", Obj::new());
    Ok(())
}

pub fn stdin_eof(sh: &Arc<Shared>, op: &Arc<Op>, f: &Frame) -> OpResult {
    managed(sh, &f.header)?.close_stdin();
    op.send("ok", b"", Obj::new());
    Ok(())
}
