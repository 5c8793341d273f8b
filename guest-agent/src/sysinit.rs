//! `init`: make a freshly restored guest unique (clock, entropy + reseed, hostname,
//! machine-id); test mode only checks the arguments.

use std::fs::OpenOptions;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::sync::Arc;

use crate::agent::{Handler, Shared};
use crate::frame::Frame;
use crate::json::{Obj, Value};
use crate::op::{Op, OpError, OpResult};
use crate::sys;

/// The requests this module answers (agent.rs's dispatch table is made of these).
pub const HANDLERS: &[(&str, Handler)] = &[
    ("init", init),
];

const RNDADDENTROPY: u64 = 0x4008_5203;
const RNDRESEEDCRNG: u64 = 0x5207;
const ENTROPY_BYTES: usize = 64;

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && !s.starts_with('-')
        && !s.ends_with('-')
        && s.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-')
}

fn is_machine_id(s: &str) -> bool {
    s.len() == 32 && s.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'))
}

pub fn init(sh: &Arc<Shared>, op: &Arc<Op>, f: &Frame) -> OpResult {
    let time_ns = match f.get("time_ns") {
        Some(Value::Int(n)) if *n > 0 => *n,
        _ => return Err(OpError::inval("time_ns must be a positive int")),
    };
    let hostname = match f.get("hostname").and_then(Value::as_str) {
        Some(h) if is_dns_label(h) => h.to_string(),
        _ => return Err(OpError::inval("hostname must be a valid DNS label")),
    };
    let machine_id = match f.get("machine_id").and_then(Value::as_str) {
        Some(m) if is_machine_id(m) => m.to_string(),
        _ => return Err(OpError::inval("machine_id must be 32 lowercase hex digits")),
    };
    if f.payload.len() != ENTROPY_BYTES {
        return Err(OpError::inval(&format!("entropy payload must be {} bytes", ENTROPY_BYTES)));
    }
    if sh.guest {
        apply(time_ns, &hostname, &machine_id, &f.payload).map_err(|e| OpError::io(&e, None))?;
    }
    op.send("ok", b"", Obj::new().put("applied", sh.guest));
    Ok(())
}

fn apply(time_ns: i128, hostname: &str, machine_id: &str, entropy: &[u8]) -> std::io::Result<()> {
    sys::set_realtime(time_ns)?;
    let random = OpenOptions::new().write(true).custom_flags(0o2000000).open("/dev/random")?;
    // struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
    let mut info = Vec::with_capacity(8 + entropy.len());
    info.extend_from_slice(&((entropy.len() * 8) as i32).to_ne_bytes());
    info.extend_from_slice(&(entropy.len() as i32).to_ne_bytes());
    info.extend_from_slice(entropy);
    sys::ioctl_ptr(random.as_raw_fd(), RNDADDENTROPY, info.as_ptr())?;
    sys::ioctl_none(random.as_raw_fd(), RNDRESEEDCRNG)?;
    sys::set_hostname(hostname)?; // /etc/hostname links to /proc/sys/kernel/hostname
    write_in_place("/etc/machine-id", &format!("{}\n", machine_id))
}

/// Every machine-id has the same length, so the file is overwritten, not truncated: a
/// truncation frees the tmpfs page and the write allocates a new one, kernel paths a clone
/// would run (and, under TCG, translate) for nothing.
pub fn write_in_place(path: &str, text: &str) -> std::io::Result<()> {
    let f = OpenOptions::new().write(true).create(true).mode(0o444).custom_flags(0o2000000).open(path)?;
    f.write_all_at(text.as_bytes(), 0)?;
    if f.metadata()?.len() != text.len() as u64 {
        f.set_len(text.len() as u64)?;
    }
    Ok(())
}
