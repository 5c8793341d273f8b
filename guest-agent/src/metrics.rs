//! `metrics`: the guest's own CPU, memory and root-disk use, sampled when asked. Nothing runs
//! between requests: CPU use is the non-idle share over a window the request opens.

use std::fs;
use std::sync::Arc;
use std::time::Duration;

use crate::agent::{Handler, Shared};
use crate::frame::Frame;
use crate::json::Obj;
use crate::op::{arg_int, Op, OpError, OpResult};

/// The requests this module answers (agent.rs's dispatch table is made of these).
pub const HANDLERS: &[(&str, Handler)] = &[
    ("metrics", metrics),
];

const DEFAULT_WINDOW_MS: i128 = 200;
const MAX_WINDOW_MS: i128 = 2000;

#[repr(C)]
struct StatVfs {
    f_bsize: u64,
    f_frsize: u64,
    f_blocks: u64,
    f_bfree: u64,
    f_bavail: u64,
    f_files: u64,
    f_ffree: u64,
    f_favail: u64,
    f_fsid: u64,
    f_flag: u64,
    f_namemax: u64,
    spare: [i32; 6],
}

extern "C" {
    fn statvfs(path: *const std::os::raw::c_char, buf: *mut StatVfs) -> i32;
    fn get_nprocs() -> i32;
}

/// (busy, total) jiffies of all CPUs: /proc/stat's aggregate line, idle = idle + iowait.
fn cpu_times() -> Result<(u64, u64), OpError> {
    let text = fs::read_to_string("/proc/stat").map_err(|e| OpError::io(&e, Some("/proc/stat")))?;
    let first: Vec<&str> = text.lines().next().unwrap_or("").split_whitespace().collect();
    if first.first() != Some(&"cpu") {
        return Err(OpError::new("EIO", "/proc/stat has no aggregate cpu line"));
    }
    let v: Vec<u64> = first[1..].iter().take(8).map(|x| x.parse().unwrap_or(0)).collect();
    let total: u64 = v.iter().sum();
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    Ok((total - idle, total))
}

/// (used, total) bytes: MemTotal - MemAvailable, the figure that predicts an OOM kill.
fn meminfo() -> (u64, u64) {
    let text = fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find(|l| l.split(':').next() == Some(name))
            .and_then(|l| l.split(':').nth(1)?.split_whitespace().next()?.parse::<u64>().ok())
            .map(|kb| kb * 1024)
    };
    let total = field("MemTotal").unwrap_or(0);
    let available = field("MemAvailable").or_else(|| field("MemFree")).unwrap_or(0);
    (total.saturating_sub(available), total)
}

pub fn metrics(_: &Arc<Shared>, op: &Arc<Op>, f: &Frame) -> OpResult {
    let window_ms = arg_int(&f.header, "window_ms", Some(DEFAULT_WINDOW_MS), 10)?.min(MAX_WINDOW_MS);
    let (busy0, total0) = cpu_times()?;
    std::thread::sleep(Duration::from_millis(window_ms as u64));
    let (busy1, total1) = cpu_times()?;
    let elapsed = total1.saturating_sub(total0);
    let cpu = if elapsed > 0 { 100.0 * busy1.saturating_sub(busy0) as f64 / elapsed as f64 } else { 0.0 };
    let (mem_used, mem_total) = meminfo();
    let mut st: StatVfs = unsafe { std::mem::zeroed() };
    if unsafe { statvfs(b"/\0".as_ptr() as *const _, &mut st) } != 0 {
        return Err(OpError::io(&std::io::Error::last_os_error(), Some("/")));
    }
    let disk_total = st.f_blocks * st.f_frsize;
    op.send(
        "metrics",
        b"",
        Obj::new()
            .put("cpu_percent", (cpu.max(0.0).min(100.0) * 100.0).round() / 100.0)
            .put("cpu_count", unsafe { get_nprocs() }.max(1))
            .put("memory_used_bytes", mem_used)
            .put("memory_total_bytes", mem_total)
            .put("disk_used_bytes", disk_total - st.f_bfree * st.f_frsize)
            .put("disk_total_bytes", disk_total)
            .put("window_ms", window_ms as i64),
    );
    Ok(())
}
