//! Terminals (`pty`, `pty_attach`): a managed process whose stdin, stdout and stderr are the
//! slave of a new pty, leading a session with it as controlling terminal, so `\x03` on the
//! master is SIGINT for the foreground job and a resize is SIGWINCH. It outlives its
//! attachments: a later `pty_attach` gets the ring, then live output.

use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use crate::agent::{Handler, Shared};
use crate::execs::{check_cwd, command, env, managed, user, WireSink};
use crate::frame::Frame;
use crate::json::{Obj, Value};
use crate::op::{arg_int, arg_opt_str, Op, OpError, OpResult};
use crate::table::Spec;
use crate::users::{self, User};

/// The requests this module answers (agent.rs's dispatch table is made of these).
pub const HANDLERS: &[(&str, Handler)] = &[
    ("pty", pty),
    ("pty_attach", attach),
];

/// Live terminals at once: each holds a pty pair and two threads in the agent.
const MAX_PTYS: usize = 64;
const MAX_DIM: i128 = 1000;
const DEFAULT_TERM: &str = "xterm-256color";
const FALLBACK_SHELL: &str = "/bin/sh";

fn dims(h: &Value) -> Result<(u16, u16), OpError> {
    let cols = arg_int(h, "cols", Some(80), 1)?;
    let rows = arg_int(h, "rows", Some(24), 1)?;
    if cols > MAX_DIM || rows > MAX_DIM {
        return Err(OpError::inval(&format!("'cols' and 'rows' must be at most {}", MAX_DIM)));
    }
    Ok((cols as u16, rows as u16))
}

/// The passwd shell of `user` (of the agent's own user without one), if it can be run.
fn login_shell(user: &Option<User>) -> String {
    let uid = match user {
        Some(u) => u.uid,
        None => unsafe { getuid() },
    };
    let shell = users::shell_of(uid).unwrap_or_default();
    let runnable = std::fs::metadata(&shell).map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0).unwrap_or(false);
    if !shell.is_empty() && runnable && !shell.ends_with("nologin") && !shell.ends_with("false") {
        shell
    } else {
        FALLBACK_SHELL.to_string()
    }
}

extern "C" {
    fn getuid() -> u32;
}

pub fn pty(sh: &Arc<Shared>, op: &Arc<Op>, f: &Frame) -> OpResult {
    let h = &f.header;
    let size = dims(h)?;
    let user = user(h)?;
    let no_cmd = h.get("cmd").map_or(true, Value::is_null) && h.get("argv").map_or(true, Value::is_null);
    let (argv, display) = if no_cmd {
        let shell = login_shell(&user);
        (vec![shell.clone()], shell)
    } else {
        command(h)?
    };
    let cwd = arg_opt_str(h, "cwd")?;
    if sh.procs.live_ttys() >= MAX_PTYS {
        return Err(OpError::new("EAGAIN", &format!("{} terminals are open already", MAX_PTYS)));
    }
    let mut vars = vec![("TERM".to_string(), DEFAULT_TERM.to_string()), ("SHELL".to_string(), login_shell(&user))];
    vars.extend(env(h)?.unwrap_or_default());
    // pty.py words a missing file (the cwd or the program) as "<path>: <why>".
    let not_found = |p: &str| OpError::new("ENOENT", &format!("{}: {}", p, crate::sys::strerror_text(2))).with_path(p);
    match check_cwd(&cwd) {
        Err(e) if e.code == "ENOENT" => return Err(not_found(cwd.as_deref().unwrap_or_default())),
        r => r?,
    }
    let spec = Spec {
        argv: &argv,
        display,
        env: Some(vars),
        cwd,
        stdin: true,
        background: true,
        timeout: None,
        user,
        tty: Some(size),
    };
    let proc = match sh.procs.start(spec) {
        Ok(p) => p,
        Err(e) if e.raw_os_error() == Some(2) => return Err(not_found(&argv[0])),
        // The exec failed (the cwd was checked above): about the program, as subprocess says.
        Err(e) if e.raw_os_error().is_some() => return Err(OpError::io(&e, Some(&argv[0]))),
        Err(e) => return Err(OpError::io(&e, None)),
    };
    op.send("spawned", b"", Obj::new().put("pid", proc.pid));
    let sh = sh.clone();
    let _ = std::thread::Builder::new().stack_size(128 * 1024).spawn(move || proc.run_io(&sh.procs));
    Ok(())
}

enum Key {
    Data(Vec<u8>),
    Resize(u16, u16),
    End,
}

/// `attached`, the ring, then live output as `stdout`, then `exit`; meanwhile `stdin`
/// (credit-controlled keystrokes) and `resize` arrive on this id. A cancel detaches.
pub fn attach(sh: &Arc<Shared>, op: &Arc<Op>, f: &Frame) -> OpResult {
    let proc = managed(sh, &f.header)?;
    if !proc.tty {
        return Err(OpError::inval(&format!("process {} has no terminal", proc.pid)));
    }
    let (tx, rx) = mpsc::channel::<Key>();
    let tx = Arc::new(Mutex::new(tx));
    let tx1 = tx.clone();
    let on_frame = Box::new(move |fr: &Frame| {
        let key = match fr.t.as_str() {
            "stdin" => Key::Data(fr.payload.clone()),
            // A bad resize is dropped: the terminal keeps its size.
            "resize" => match dims(&fr.header) {
                Ok((c, r)) => Key::Resize(c, r),
                Err(_) => return,
            },
            _ => return,
        };
        let _ = tx1.lock().unwrap_or_else(|e| e.into_inner()).send(key);
    });
    let tx2 = tx.clone();
    let on_cancel = Arc::new(move |o: &Op| {
        let _ = tx2.lock().unwrap_or_else(|e| e.into_inner()).send(Key::End);
        o.release();
    });
    let tx3 = tx.clone();
    let sink = Arc::new(WireSink::new(
        op.clone(),
        Some(Box::new(move || {
            let _ = tx3.lock().unwrap_or_else(|e| e.into_inner()).send(Key::End);
        })),
    ));
    op.set_handlers(on_frame, on_cancel);
    // Keystrokes and resizes in order, here: a write to the master blocks while the
    // terminal's input queue is full, which must never stall the agent's reader.
    let (op2, p2) = (op.clone(), proc.clone());
    let _ = std::thread::Builder::new().stack_size(64 * 1024).spawn(move || {
        while let Ok(key) = rx.recv() {
            match key {
                Key::Data(d) => {
                    let _ = p2.write_stdin(&d); // the terminal is gone: keep granting
                    op2.consumed(d.len() as u64);
                }
                Key::Resize(c, r) => p2.resize(c, r),
                Key::End => break,
            }
        }
    });
    let _held = sink.hold();
    let b = proc.attach(sink.clone());
    if b.info.is_none() {
        op.keep.store(true, Ordering::SeqCst);
    }
    op.send("attached", b"", Obj::new().put("pid", proc.pid));
    if !b.out.is_empty() && !op.send_data("stdout", &b.out) {
        return Ok(());
    }
    if let Some(info) = b.info {
        op.send("exit", b"", info.fields());
        let _ = tx.lock().unwrap_or_else(|e| e.into_inner()).send(Key::End);
    }
    Ok(())
}
