//! `code`: relay one request to the code interpreter's unix socket and stream its answer
//! back as credit-controlled `data` frames, then `eof`. Cancelling closes the connection,
//! which the interpreter takes as "interrupt this run".

use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use crate::agent::{Handler, Shared};
use crate::frame::Frame;
use crate::json::{self, Obj, Value};
use crate::op::{Op, OpError, OpResult};

/// The requests this module answers (agent.rs's dispatch table is made of these).
pub const HANDLERS: &[(&str, Handler)] = &[
    ("code", code),
];

pub const SOCKET_PATH: &str = "/run/pandastack/code.sock";
const READ_SIZE: usize = 256 * 1024;

fn request_line(payload: &[u8]) -> Result<String, OpError> {
    let req = std::str::from_utf8(payload)
        .ok()
        .and_then(|t| json::parse(t).ok())
        .ok_or_else(|| OpError::inval("code request payload is not JSON"))?;
    if !matches!(req, Value::Obj(_)) || req.get("op").and_then(Value::as_str).is_none() {
        return Err(OpError::inval("code request must be a JSON object with an 'op'"));
    }
    // Compact JSON has no raw newline: the request is exactly one line.
    Ok(json::to_ascii_string(&req) + "\n")
}

pub fn code(sh: &Arc<Shared>, op: &Arc<Op>, f: &Frame) -> OpResult {
    let line = request_line(&f.payload)?;
    let mut sock = match UnixStream::connect(&sh.code_socket) {
        Ok(s) => s,
        Err(e) if e.raw_os_error() == Some(2) => {
            return Err(OpError::new("code_unavailable", "this sandbox's template has no code interpreter"))
        }
        Err(e) => {
            let why = format!("the code interpreter is not running ({})", e);
            return Err(OpError::new("code_unavailable", &why));
        }
    };
    sock.write_all(line.as_bytes()).map_err(|e| OpError::io(&e, None))?;
    let waker = sock.try_clone().map_err(|e| OpError::io(&e, None))?;
    // The reader thread calls this: it only wakes the read below, never blocks.
    op.set_handlers(Box::new(|_| {}), Arc::new(move |_: &Op| {
        let _ = waker.shutdown(Shutdown::Both);
    }));
    let mut total: u64 = 0;
    let mut buf = vec![0u8; READ_SIZE];
    loop {
        let n = match sock.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => 0,
        };
        if n == 0 || op.is_cancelled() {
            break;
        }
        if !op.send_data("data", &buf[..n]) {
            return Ok(());
        }
        total += n as u64;
    }
    if !op.is_cancelled() {
        op.send("eof", b"", Obj::new().put("size", total));
    }
    Ok(())
}
