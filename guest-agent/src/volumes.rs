//! `mount_volume` / `unmount_volume` / `freeze_volume`: a durable volume the host backed a
//! baked virtio-blk slot with. The slot is found by its virtio serial (learnt once at the
//! template's boot: a restore keeps the device set), its new capacity awaited, and it is
//! mounted with mount(2) directly (a `mount` process costs tens of ms under TCG).

use std::collections::HashMap;
use std::ffi::CString;
use std::fs::{self, OpenOptions};
use std::os::raw::{c_char, c_int, c_ulong, c_void};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::agent::{py_repr, Handler, Shared};
use crate::frame::Frame;
use crate::json::{Obj, Value};
use crate::op::{arg_bool, arg_int, arg_str, Op, OpError, OpResult};
use crate::sys;

/// The requests this module answers (agent.rs's dispatch table is made of these).
pub const HANDLERS: &[(&str, Handler)] = &[
    ("mount_volume", mount_volume),
    ("unmount_volume", unmount_volume),
    ("freeze_volume", freeze_volume),
];

const SYS_BLOCK: &str = "/sys/block";
const CAPACITY_WAIT: Duration = Duration::from_secs(5);
const MS_RDONLY: c_ulong = 1;
const MS_NOSUID: c_ulong = 2;
const MS_NODEV: c_ulong = 4;
const FIFREEZE: u64 = 0xC004_5877;
/// Mount points a volume may not cover: the agent's own and the kernel's file systems.
const FORBIDDEN: &[&str] = &["/", "/proc", "/sys", "/dev", "/run", "/opt/pandastack", "/tmp"];

extern "C" {
    fn mount(src: *const c_char, target: *const c_char, fstype: *const c_char, flags: c_ulong,
             data: *const c_void) -> c_int;
    fn umount2(target: *const c_char, flags: c_int) -> c_int;
}

static DISKS: Mutex<Option<HashMap<String, String>>> = Mutex::new(None);

/// serial -> disk name of every disk now; remembered for later lookups.
pub fn learn_disks() -> HashMap<String, String> {
    let mut found = HashMap::new();
    let mut names: Vec<String> = fs::read_dir(SYS_BLOCK)
        .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned())).collect())
        .unwrap_or_default();
    names.sort();
    for name in names {
        if let Ok(serial) = fs::read_to_string(format!("{}/{}/serial", SYS_BLOCK, name)) {
            found.insert(serial.trim().to_string(), name);
        }
    }
    *DISKS.lock().unwrap_or_else(|e| e.into_inner()) = Some(found.clone());
    found
}

fn device_of(serial: &str) -> Result<(String, String), OpError> {
    let known = DISKS.lock().unwrap_or_else(|e| e.into_inner()).as_ref().and_then(|d| d.get(serial).cloned());
    let name = match known {
        Some(n) if fs::metadata(format!("{}/{}", SYS_BLOCK, n)).map(|m| m.is_dir()).unwrap_or(false) => Some(n),
        _ => learn_disks().get(serial).cloned(),
    };
    match name {
        Some(n) => Ok((format!("/dev/{}", n), format!("{}/{}", SYS_BLOCK, n))),
        None => Err(OpError::new(
            "ENODEV",
            &format!("no disk with serial {} (is the template baked with volume slots?)", py_repr(&Value::Str(serial.to_string()))),
        )),
    }
}

fn wait_capacity(sys_dir: &str, size_bytes: i128) -> Result<(), OpError> {
    let deadline = Instant::now() + CAPACITY_WAIT;
    loop {
        let path = format!("{}/size", sys_dir);
        let text = fs::read_to_string(&path).map_err(|e| OpError::io(&e, Some(&path)))?;
        let seen = text.trim().parse::<i128>().unwrap_or(0) * 512;
        if seen == size_bytes {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(OpError::new("ETIMEDOUT", &format!("{}: the disk shows {} bytes, not {}", sys_dir, seen, size_bytes)));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Python's os.path.normpath for the absolute and relative paths a host may send.
pub fn normpath(path: &str) -> String {
    let abs = path.starts_with('/');
    let lead = if path.starts_with("//") && !path.starts_with("///") { "//" } else if abs { "/" } else { "" };
    let mut parts: Vec<&str> = Vec::new();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                if parts.last().map_or(false, |p| *p != "..") {
                    parts.pop();
                } else if !abs {
                    parts.push("..");
                }
            }
            c => parts.push(c),
        }
    }
    let joined = format!("{}{}", lead, parts.join("/"));
    if joined.is_empty() { ".".to_string() } else { joined }
}

fn check_mount_path(path: &str) -> Result<String, OpError> {
    let norm = normpath(path);
    if !norm.starts_with('/') {
        return Err(OpError::inval("mount path must be absolute").with_path(path));
    }
    for bad in FORBIDDEN {
        if norm == *bad || (*bad != "/" && norm.starts_with(&format!("{}/", bad))) {
            return Err(OpError::inval(&format!("a volume cannot be mounted on or under {}", bad)).with_path(path));
        }
    }
    Ok(norm)
}

fn cstr(s: &str) -> Result<CString, OpError> {
    CString::new(s).map_err(|_| OpError::inval("path contains NUL"))
}

pub fn mount_volume(_: &Arc<Shared>, op: &Arc<Op>, f: &Frame) -> OpResult {
    let serial = arg_str(&f.header, "serial", None)?;
    let path = check_mount_path(&arg_str(&f.header, "path", None)?)?;
    let read_only = arg_bool(&f.header, "read_only", false)?;
    let size_bytes = arg_int(&f.header, "size_bytes", None, 1)?;
    let (device, sys_dir) = device_of(&serial)?;
    wait_capacity(&sys_dir, size_bytes)?;
    fs::create_dir_all(&path).map_err(|e| OpError::io(&e, Some(&path)))?;
    let flags = MS_NOSUID | MS_NODEV | if read_only { MS_RDONLY } else { 0 };
    // A read-only mount still replays a journal a killed writer left (the host gives a
    // reader an overlay of its own). `discard`: freed blocks go back to the host as holes.
    let data = CString::new("discard").unwrap();
    let (dev, target, ext4) = (cstr(&device)?, cstr(&path)?, CString::new("ext4").unwrap());
    let data_ptr = if read_only { std::ptr::null() } else { data.as_ptr() as *const c_void };
    if unsafe { mount(dev.as_ptr(), target.as_ptr(), ext4.as_ptr(), flags, data_ptr) } != 0 {
        return Err(OpError::io(&std::io::Error::last_os_error(), Some(&path)));
    }
    op.send("ok", b"", Obj::new().put("device", device));
    Ok(())
}

/// Flush the file system at `path` and leave it frozen, clean on disk, just before the
/// host kills the VM: the next mount has no journal to replay.
pub fn freeze_volume(_: &Arc<Shared>, op: &Arc<Op>, f: &Frame) -> OpResult {
    let path = check_mount_path(&arg_str(&f.header, "path", None)?)?;
    let dir = OpenOptions::new()
        .read(true)
        .custom_flags(0o200000 | 0o2000000) // O_DIRECTORY | O_CLOEXEC
        .open(&path)
        .map_err(|e| OpError::io(&e, Some(&path)))?;
    if let Err(e) = sys::ioctl_ptr(dir.as_raw_fd(), FIFREEZE, std::ptr::null()) {
        if e.raw_os_error() != Some(16) {
            // EBUSY: frozen already
            return Err(OpError::io(&e, None));
        }
    }
    op.send("ok", b"", Obj::new());
    Ok(())
}

pub fn unmount_volume(_: &Arc<Shared>, op: &Arc<Op>, f: &Frame) -> OpResult {
    let path = check_mount_path(&arg_str(&f.header, "path", None)?)?;
    sys::sync_all();
    let target = cstr(&path)?;
    if unsafe { umount2(target.as_ptr(), 0) } != 0 {
        return Err(OpError::io(&std::io::Error::last_os_error(), Some(&path)));
    }
    op.send("ok", b"", Obj::new());
    Ok(())
}
