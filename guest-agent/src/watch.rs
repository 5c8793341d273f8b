//! `watch`: inotify on a directory (and, recursive, every directory under it), as
//! guest/watch.py does it (docs/adr/0029-file-watch.md). Two threads per watch: the inotify
//! reader decodes events, follows new directories and fills a bounded queue; the op's worker
//! sends the queue as `events` frames under the op's credit. A queue that fills, or the
//! kernel's own overflow, ends the watch with `eof{reason:"overflow"}`.

use std::collections::{HashMap, HashSet, VecDeque};
use std::ffi::CString;
use std::fs::File;
use std::io::{Read, Write};
use std::os::raw::{c_char, c_int};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::io::{AsRawFd, FromRawFd};
use std::sync::{Arc, Condvar, Mutex};

use crate::agent::{Handler, Shared};
use crate::frame::{Frame, MAX_CHUNK};
use crate::json::{self, Obj};
use crate::op::{arg_bool, arg_str, Op, OpError, OpResult};
use crate::sys;

/// The requests this module answers (agent.rs's dispatch table is made of these).
pub const HANDLERS: &[(&str, Handler)] = &[
    ("watch", watch),
];

/// Events a watch holds for a host that does not read; one more ends it in overflow.
const MAX_QUEUED: usize = 10_000;
/// JSON bytes of one `events` frame.
const BATCH_BYTES: usize = 64 * 1024;
/// Directories one recursive watch follows; past it the watch ends in overflow.
const MAX_WATCHES: usize = 65_536;
/// How long an IN_MOVED_FROM waits for its IN_MOVED_TO before it counts as a remove.
const PAIR_WAIT_MS: i32 = 10;
const WATCH_FRAME_CREDIT: u64 = 4096;

const IN_MODIFY: u32 = 0x2;
const IN_ATTRIB: u32 = 0x4;
const IN_MOVED_FROM: u32 = 0x40;
const IN_MOVED_TO: u32 = 0x80;
const IN_CREATE: u32 = 0x100;
const IN_DELETE: u32 = 0x200;
const IN_DELETE_SELF: u32 = 0x400;
const IN_MOVE_SELF: u32 = 0x800;
const IN_UNMOUNT: u32 = 0x2000;
const IN_Q_OVERFLOW: u32 = 0x4000;
const IN_IGNORED: u32 = 0x8000;
const IN_ONLYDIR: u32 = 0x0100_0000;
const IN_DONT_FOLLOW: u32 = 0x0200_0000;
const IN_ISDIR: u32 = 0x4000_0000;
const MASK: u32 = IN_MODIFY | IN_ATTRIB | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
    | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR | IN_DONT_FOLLOW;
const O_NONBLOCK: c_int = 0o4000;
const O_CLOEXEC: c_int = 0o2000000;

extern "C" {
    fn inotify_init1(flags: c_int) -> c_int;
    fn inotify_add_watch(fd: c_int, path: *const c_char, mask: u32) -> c_int;
    fn inotify_rm_watch(fd: c_int, wd: c_int) -> c_int;
    fn pipe2(fds: *mut c_int, flags: c_int) -> c_int;
}

struct Ev {
    kind: &'static str,
    path: String,
    is_dir: bool,
    old_path: Option<String>,
}

impl Ev {
    fn new(kind: &'static str, path: &str, is_dir: bool) -> Ev {
        Ev { kind, path: path.to_string(), is_dir, old_path: None }
    }
    fn json(&self) -> String {
        let mut o = Obj::new().put("type", self.kind).put("path", self.path.as_str());
        if let Some(old) = &self.old_path {
            o = o.put("old_path", old.as_str());
        }
        json::to_ascii_string(&o.put("is_dir", self.is_dir).value())
    }
}

struct Queue {
    events: VecDeque<Ev>,
    /// Why the watch ended ("overflow", "removed", "unmounted", "stopped"), once it did.
    end: Option<&'static str>,
}

struct WShared {
    q: Mutex<Queue>,
    cond: Condvar,
    wake: Mutex<Option<File>>,
}

impl WShared {
    fn put(&self, ev: Ev) {
        let mut q = self.q.lock().unwrap_or_else(|e| e.into_inner());
        if q.end.is_some() {
            return;
        }
        if ev.kind == "write" {
            if let Some(last) = q.events.back() {
                if last.kind == "write" && last.path == ev.path {
                    return; // a run of writes to one file is one event
                }
            }
        }
        if q.events.len() >= MAX_QUEUED {
            q.end = Some("overflow");
        } else {
            q.events.push_back(ev);
        }
        self.cond.notify_all();
    }
    fn finish(&self, reason: &'static str) {
        let mut q = self.q.lock().unwrap_or_else(|e| e.into_inner());
        if q.end.is_none() {
            q.end = Some(reason);
        }
        self.cond.notify_all();
    }
    /// Wake the reader and the sender (from any thread; never blocks).
    fn stop(&self) {
        if let Some(w) = self.wake.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            let _ = (&*w).write(b"x");
        }
        self.finish("stopped");
    }
    /// The next batch of events as JSON, or, once none are left, why the watch ended.
    fn take(&self) -> (Vec<String>, Option<&'static str>) {
        let mut q = self.q.lock().unwrap_or_else(|e| e.into_inner());
        while q.events.is_empty() && q.end.is_none() {
            q = self.cond.wait(q).unwrap_or_else(|e| e.into_inner());
        }
        let mut batch = Vec::new();
        let mut size = 2;
        while let Some(ev) = q.events.front() {
            let item = ev.json();
            if !batch.is_empty() && size + item.len() + 1 > BATCH_BYTES {
                break;
            }
            q.events.pop_front();
            if item.len() + 2 > MAX_CHUNK {
                continue; // cannot happen with PATH_MAX paths; never break the frame
            }
            size += item.len() + 1;
            batch.push(item);
        }
        let end = if batch.is_empty() { q.end } else { None };
        (batch, end)
    }
}

struct Reader {
    fd: File,
    wake_r: File,
    root: String,
    recursive: bool,
    paths: HashMap<c_int, String>,
    pending: Option<(u32, String, bool)>,
    /// Paths a scan of a new directory told as created since the kernel's queue was last
    /// read empty: made between the directory's inotify_add_watch and its scan, an entry is
    /// also in that queue (its IN_CREATE), and must not be told twice (as guest/watch.py).
    scanned: HashSet<String>,
    sh: Arc<WShared>,
}

fn join(base: &str, name: &str) -> String {
    if base.ends_with('/') { format!("{}{}", base, name) } else { format!("{}/{}", base, name) }
}

impl Reader {
    fn add_one(&mut self, path: &str) -> Result<bool, std::io::Error> {
        if self.paths.len() >= MAX_WATCHES {
            self.sh.finish("overflow"); // what happens past the limit would go unseen
            return Ok(false);
        }
        let c = match CString::new(crate::osstr::to_bytes(path)) {
            Ok(c) => c,
            Err(_) => return Ok(false),
        };
        let wd = unsafe { inotify_add_watch(self.fd.as_raw_fd(), c.as_ptr(), MASK) };
        if wd < 0 {
            let e = std::io::Error::last_os_error();
            if path == self.root {
                return Err(e);
            }
            return Ok(false); // gone already, or not a directory any more
        }
        self.paths.insert(wd, path.to_string());
        Ok(true)
    }

    /// Follow `path` (and, recursive, the directories under it); with `report`, what is
    /// inside already counts as created (it may have appeared before the watch did).
    fn add(&mut self, path: &str, report: bool) -> Result<(), std::io::Error> {
        if !self.add_one(path)? || !self.recursive {
            return Ok(());
        }
        let mut stack = vec![path.to_string()];
        while let Some(d) = stack.pop() {
            let entries = match std::fs::read_dir(crate::osstr::path(&d)) {
                Ok(rd) => rd,
                Err(_) => continue,
            };
            for entry in entries.flatten() {
                let is_dir = match entry.file_type() {
                    Ok(t) => t.is_dir(),
                    Err(_) => continue,
                };
                let p = join(&d, &crate::osstr::to_string(entry.file_name().as_bytes()));
                if report {
                    self.sh.put(Ev::new("create", &p, is_dir));
                    self.scanned.insert(p.clone());
                }
                if is_dir && self.add_one(&p)? {
                    stack.push(p);
                }
            }
        }
        Ok(())
    }

    fn unfollow(&mut self, path: &str) {
        let prefix = format!("{}/", path);
        let gone: Vec<c_int> = self.paths.iter().filter(|(_, p)| *p == path || p.starts_with(&prefix)).map(|(w, _)| *w).collect();
        for wd in gone {
            unsafe { inotify_rm_watch(self.fd.as_raw_fd(), wd) };
            self.paths.remove(&wd);
        }
    }

    fn moved_dir(&mut self, old: &str, new: &str) {
        let prefix = format!("{}/", old);
        for p in self.paths.values_mut() {
            if p == old || p.starts_with(&prefix) {
                *p = format!("{}{}", new, &p[old.len()..]);
            }
        }
    }

    fn flush_pending(&mut self) {
        if let Some((_, path, is_dir)) = self.pending.take() {
            if is_dir {
                self.unfollow(&path);
            }
            self.sh.put(Ev::new("remove", &path, is_dir));
        }
    }

    fn ended(&self) -> bool {
        self.sh.q.lock().unwrap_or_else(|e| e.into_inner()).end.is_some()
    }

    fn run(&mut self) {
        let mut buf = vec![0u8; 256 * 1024];
        while !self.ended() {
            let timeout = if self.pending.is_some() { PAIR_WAIT_MS } else { -1 };
            let mut fds = [
                sys::PollFd { fd: self.fd.as_raw_fd(), events: sys::POLLIN, revents: 0 },
                sys::PollFd { fd: self.wake_r.as_raw_fd(), events: sys::POLLIN, revents: 0 },
            ];
            match sys::poll_fds(&mut fds, timeout) {
                Err(_) => {
                    self.sh.finish("overflow"); // events may be lost from here on
                    return;
                }
                Ok(0) => {
                    self.flush_pending();
                    continue;
                }
                Ok(_) => {}
            }
            if fds[1].revents != 0 {
                return;
            }
            match (&self.fd).read(&mut buf) {
                Ok(n) => {
                    let data = buf[..n].to_vec();
                    self.decode(&data);
                    self.drain_after_scans(&mut buf);
                }
                Err(_) => continue, // EAGAIN
            }
        }
    }

    /// Read on until the kernel's queue is empty, then forget what the scans told: an entry
    /// a scan saw was made before the scan read its directory, so its IN_CREATE (if the
    /// watch was there to see it) was queued before that empty read.
    fn drain_after_scans(&mut self, buf: &mut [u8]) {
        while !self.scanned.is_empty() && !self.ended() {
            match (&self.fd).read(buf) {
                Ok(n) if n > 0 => {
                    let data = buf[..n].to_vec();
                    self.decode(&data);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() != std::io::ErrorKind::WouldBlock => {
                    self.sh.finish("overflow"); // events may be lost from here on
                    return;
                }
                _ => {
                    self.scanned.clear();
                    return;
                }
            }
        }
    }

    fn created(&mut self, path: String, is_dir: bool) {
        if self.scanned.remove(&path) {
            return; // told by the scan of its new directory, and followed
        }
        self.sh.put(Ev::new("create", &path, is_dir));
        if is_dir && self.recursive {
            let _ = self.add(&path, true);
        }
    }

    fn decode(&mut self, data: &[u8]) {
        let mut pos = 0;
        let u32_at = |k: usize| u32::from_ne_bytes([data[k], data[k + 1], data[k + 2], data[k + 3]]);
        while pos + 16 <= data.len() && !self.ended() {
            let wd = u32_at(pos) as c_int;
            let (mask, cookie, len) = (u32_at(pos + 4), u32_at(pos + 8), u32_at(pos + 12) as usize);
            let end = (pos + 16 + len).min(data.len());
            let raw: Vec<u8> = data[pos + 16..end].iter().copied().take_while(|&c| c != 0).collect();
            pos += 16 + len;
            if mask & IN_Q_OVERFLOW != 0 {
                self.sh.finish("overflow");
                return;
            }
            let base = match self.paths.get(&wd) {
                Some(b) => b.clone(),
                None => continue,
            };
            let is_dir = mask & IN_ISDIR != 0;
            let path = if raw.is_empty() { base.clone() } else { join(&base, &crate::osstr::to_string(&raw)) };
            let pairs = matches!(&self.pending, Some((c, _, _)) if mask & IN_MOVED_TO != 0 && *c == cookie);
            if self.pending.is_some() && !pairs {
                self.flush_pending();
            }
            if mask & (IN_DELETE | IN_MOVED_FROM) != 0 {
                self.scanned.remove(&path); // made again after this, it is a new create
            }
            if mask & IN_MOVED_FROM != 0 {
                self.pending = Some((cookie, path, is_dir));
            } else if mask & IN_MOVED_TO != 0 {
                if let Some((_, old, _)) = self.pending.take() {
                    if is_dir {
                        self.moved_dir(&old, &path);
                    }
                    self.sh.put(Ev { kind: "rename", path, is_dir, old_path: Some(old) });
                } else {
                    self.created(path, is_dir);
                }
            } else if mask & IN_CREATE != 0 {
                self.created(path, is_dir);
            } else if mask & IN_MODIFY != 0 {
                self.sh.put(Ev::new("write", &path, is_dir));
            } else if mask & IN_ATTRIB != 0 {
                // a directory's own attribute change is told by its parent's watch
                if !raw.is_empty() || base == self.root {
                    self.sh.put(Ev::new("chmod", &path, is_dir));
                }
            } else if mask & IN_DELETE != 0 {
                self.sh.put(Ev::new("remove", &path, is_dir));
            } else if mask & (IN_DELETE_SELF | IN_MOVE_SELF) != 0 && base == self.root {
                self.sh.finish("removed");
            } else if mask & IN_UNMOUNT != 0 && base == self.root {
                self.sh.finish("unmounted");
            } else if mask & IN_IGNORED != 0 {
                self.paths.remove(&wd);
            }
        }
    }
}

fn new_reader(root: &str, recursive: bool) -> Result<Reader, OpError> {
    let fd = unsafe { inotify_init1(O_NONBLOCK | O_CLOEXEC) };
    if fd < 0 {
        return Err(OpError::io(&std::io::Error::last_os_error(), None));
    }
    let fd = unsafe { File::from_raw_fd(fd) };
    let mut p = [-1 as c_int; 2];
    if unsafe { pipe2(p.as_mut_ptr(), O_NONBLOCK | O_CLOEXEC) } != 0 {
        return Err(OpError::io(&std::io::Error::last_os_error(), None));
    }
    let (wake_r, wake_w) = unsafe { (File::from_raw_fd(p[0]), File::from_raw_fd(p[1])) };
    let sh = Arc::new(WShared {
        q: Mutex::new(Queue { events: VecDeque::new(), end: None }),
        cond: Condvar::new(),
        wake: Mutex::new(Some(wake_w)),
    });
    let mut r = Reader {
        fd, wake_r, root: root.to_string(), recursive, paths: HashMap::new(), pending: None,
        scanned: HashSet::new(), sh,
    };
    match std::fs::metadata(root) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(OpError::new("ENOTDIR", "Not a directory (watch a directory)").with_path(root)),
        Err(e) => return Err(OpError::io(&e, Some(root))),
    }
    r.add(root, false).map_err(|e| OpError::io(&e, Some(root)))?;
    Ok(r)
}

fn take_credit(op: &Op, n: u64) -> bool {
    let mut got = 0;
    while got < n {
        let k = op.credit.take(n - got);
        if k == 0 || op.is_cancelled() {
            return false;
        }
        got += k;
    }
    true
}

pub fn watch(_: &Arc<Shared>, op: &Arc<Op>, f: &Frame) -> OpResult {
    let path = arg_str(&f.header, "path", None)?;
    let recursive = arg_bool(&f.header, "recursive", true)?;
    let root = crate::volumes::normpath(&path);
    let mut reader = new_reader(&root, recursive)?;
    let sh = reader.sh.clone();
    let sh2 = sh.clone();
    op.set_handlers(Box::new(|_| {}), Arc::new(move |_: &Op| sh2.stop()));
    let mut thread = None;
    if op.send("watching", b"", Obj::new().put("path", root.as_str()).put("recursive", recursive)) {
        thread = std::thread::Builder::new().stack_size(128 * 1024).spawn(move || reader.run()).ok();
        loop {
            let (batch, end) = sh.take();
            if op.is_cancelled() {
                break;
            }
            if let Some(reason) = end {
                if reason != "stopped" {
                    op.send("eof", b"", Obj::new().put("reason", reason));
                }
                break;
            }
            let payload = format!("[{}]", batch.join(","));
            let cost = (payload.len() as u64).max(WATCH_FRAME_CREDIT);
            if !take_credit(op, cost) || !op.send("events", payload.as_bytes(), Obj::new()) {
                break;
            }
        }
    }
    sh.stop();
    if let Some(t) = thread {
        let _ = t.join();
    }
    Ok(())
}
