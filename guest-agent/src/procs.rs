//! Managed processes: spawning in a new session, output pumping, exit, kill, and the table
//! of running and remembered ones (guest/procs.py in the reference agent).
//!
//! One I/O loop per process (the exec op's own thread, or a thread of its own for spawn)
//! polls stdout, stderr and a pidfd. Output goes into a capped ring per stream and to the
//! attached sinks; a sink without credit blocks the loop, which blocks the pipe, which
//! blocks the process (plain pipe backpressure).

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::io::{AsRawFd, FromRawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::cgroups::Cgroups;
use crate::json::{Obj, Value};
use crate::sys;
use crate::users::User;

const RING_BYTES: usize = 1 << 20;
const READ_SIZE: usize = 64 * 1024;
/// After the main process exited, how long descendants may keep its pipes open before the
/// exit is reported anyway.
const EXIT_GRACE: Duration = Duration::from_secs(1);
/// The same once its cgroup was killed: every descendant is dying, but a thousand of them (a
/// fork bomb) take seconds to exit on one TCG vCPU; the exit is reported once they have, so
/// the next exec meets neither them nor the pids limit they still hold.
const KILLED_GRACE: Duration = Duration::from_secs(10);
const MAX_FINISHED: usize = 64;
/// A terminal's ring is smaller than a pipe's: a re-attach repaints a screen, it does not
/// replay a log.
const PTY_RING_BYTES: usize = 256 * 1024;

pub const DEFAULT_ENV: &[(&str, &str)] = &[
    ("PATH", "/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"),
    ("VIRTUAL_ENV", "/opt/venv"),
    ("HOME", "/root"),
    ("LANG", "C.UTF-8"),
];

#[derive(Clone, Copy, PartialEq)]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    pub fn name(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

#[derive(Clone)]
pub struct ExitInfo {
    pub code: i32,
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub duration_ms: f64,
}

impl ExitInfo {
    pub fn fields(&self) -> Obj {
        Obj::new()
            .put("code", self.code)
            .put("signal", self.signal)
            .put("timed_out", self.timed_out)
            .put("duration_ms", self.duration_ms)
    }
}

/// Receives one process's output; `deliver` may block (flow control).
pub trait Sink: Send + Sync {
    fn closed(&self) -> bool;
    fn deliver(&self, stream: Stream, data: &[u8]);
    fn finish(&self, info: &ExitInfo);
}

struct Ring {
    buf: Vec<u8>,
    dropped: u64,
    cap: usize,
}

impl Ring {
    fn new(cap: usize) -> Ring {
        Ring { buf: Vec::new(), dropped: 0, cap }
    }
    fn append(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
        let over = self.buf.len().saturating_sub(self.cap);
        if over > 0 {
            self.buf.drain(..over);
            self.dropped += over as u64;
        }
    }
}

struct Inner {
    rings: [Ring; 2],
    sinks: Vec<Arc<dyn Sink>>,
    info: Option<ExitInfo>,
}

pub struct Proc {
    pub pid: i32,
    pub display: String,
    pub background: AtomicBool,
    started_wall: f64,
    t0: Instant,
    /// On a terminal (`pty`): stdin is a second descriptor of its master, stdout the master.
    pub tty: bool,
    inner: Mutex<Inner>,
    stdin: Mutex<Option<File>>,
    pipes: Mutex<Vec<(File, Stream)>>,
    timed_out: AtomicBool,
    done: Mutex<bool>,
    done_cv: Condvar,
    io: Mutex<Option<Child>>,
    cgroups: Option<Arc<Cgroups>>,
    /// The tree's cgroup leaf until it goes back to the pool: a kill after that must not
    /// reach the next exec's tree, so both take this lock.
    leaf: Mutex<Option<String>>,
    leaf_killed: AtomicBool,
}

/// What the backlog of an attach was: output so far, the exit if any, bytes the rings lost.
pub struct Backlog {
    pub out: Vec<u8>,
    pub err: Vec<u8>,
    pub info: Option<ExitInfo>,
    pub dropped: [u64; 2],
}

impl Proc {
    pub fn kill_tree(&self, sig: i32) {
        if sig == sys::SIGKILL {
            if let Some(cg) = &self.cgroups {
                let leaf = self.leaf.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(l) = leaf.as_ref() {
                    cg.kill(l);
                    self.leaf_killed.store(true, Ordering::SeqCst);
                }
            }
        }
        sys::killpg(self.pid, sig);
    }

    pub fn info(&self) -> Option<ExitInfo> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).info.clone()
    }

    pub fn write_stdin(&self, data: &[u8]) -> io::Result<()> {
        let mut g = self.stdin.lock().unwrap_or_else(|e| e.into_inner());
        match g.as_mut() {
            Some(pipe) => pipe.write_all(data),
            None => Err(io::Error::from_raw_os_error(32)),
        }
    }

    /// Write to stdin, waiting at most `within` for the process to make room: EAGAIN past
    /// that (how much went in is in the message), so a process that never reads its stdin
    /// does not hold the request, and a thread of this agent, forever.
    pub fn write_stdin_within(&self, data: &[u8], within: Duration) -> Result<(), (i32, String)> {
        let mut g = self.stdin.lock().unwrap_or_else(|e| e.into_inner());
        let pipe = match g.as_mut() {
            Some(p) => p,
            None => return Err((32, "stdin is closed".to_string())),
        };
        let fd = pipe.as_raw_fd();
        let deadline = Instant::now() + within;
        sys::set_nonblocking(fd, true);
        let mut done = 0;
        let result = loop {
            if done == data.len() {
                break Ok(());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let mut fds = [sys::PollFd { fd, events: sys::POLLOUT, revents: 0 }];
            let ready = !left.is_zero() && sys::poll_fds(&mut fds, left.as_millis() as i32 + 1).unwrap_or(0) > 0;
            if !ready {
                break Err((11, format!("the process has not read its stdin for {:.0} s ({} of {} bytes written)",
                                       within.as_secs_f64(), done, data.len())));
            }
            match pipe.write(&data[done..]) {
                Ok(n) => done += n,
                Err(e) if e.raw_os_error() == Some(11) || e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => break Err((e.raw_os_error().unwrap_or(5), sys::strerror_text(e.raw_os_error().unwrap_or(5)))),
            }
        };
        sys::set_nonblocking(fd, false);
        result
    }

    /// TIOCSWINSZ on the terminal's master: the kernel sends SIGWINCH to its foreground job.
    pub fn resize(&self, cols: u16, rows: u16) {
        if let Some(f) = self.stdin.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            sys::set_winsize(f.as_raw_fd(), cols, rows);
        }
    }

    pub fn close_stdin(&self) {
        self.stdin.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    pub fn add_sink(&self, sink: Arc<dyn Sink>) {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).sinks.push(sink);
    }

    /// Register `sink` (unless the process already exited) and take the backlog, in one
    /// step. The caller holds the sink's own delivery lock meanwhile and while it sends the
    /// backlog, so live output cannot overtake it.
    pub fn attach(&self, sink: Arc<dyn Sink>) -> Backlog {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let b = Backlog {
            out: inner.rings[0].buf.clone(),
            err: inner.rings[1].buf.clone(),
            info: inner.info.clone(),
            dropped: [inner.rings[0].dropped, inner.rings[1].dropped],
        };
        if b.info.is_none() {
            inner.sinks.push(sink);
        }
        b
    }

    fn emit(&self, stream: Stream, data: &[u8]) {
        let sinks = {
            let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            inner.rings[stream as usize].append(data);
            inner.sinks.clone()
        };
        let mut dead = false;
        for s in &sinks {
            if s.closed() {
                dead = true;
                continue;
            }
            s.deliver(stream, data);
            dead = dead || s.closed();
        }
        if dead {
            self.inner.lock().unwrap_or_else(|e| e.into_inner()).sinks.retain(|s| !s.closed());
        }
    }

    pub fn describe(&self) -> Value {
        let info = self.info();
        let o = Obj::new()
            .put("pid", self.pid)
            .put("cmd", self.display.chars().take(256).collect::<String>())
            .put("running", info.is_none())
            .put("background", self.background.load(Ordering::SeqCst))
            .put("exit_code", info.as_ref().map(|i| i.code))
            .put("signal", info.as_ref().and_then(|i| i.signal))
            .put("timed_out", self.timed_out.load(Ordering::SeqCst))
            .put("started", self.started_wall);
        if self.tty { o.put("tty", true).value() } else { o.value() }
    }

    /// The process's I/O loop, until it exited and its pipes closed (or the grace passed:
    /// then the exit is reported and the pipes are drained into the rings until EOF, so
    /// descendants never get SIGPIPE).
    pub fn run_io(self: &Arc<Self>, table: &ProcTable) {
        let mut child = match self.io.lock().unwrap_or_else(|e| e.into_inner()).take() {
            Some(c) => c,
            None => return,
        };
        let mut pipes = std::mem::take(&mut *self.pipes.lock().unwrap_or_else(|e| e.into_inner()));
        let exit_fd = sys::pidfd_open(self.pid).ok().map(|fd| unsafe { File::from_raw_fd(fd) });
        let mut buf = vec![0u8; READ_SIZE];
        let mut exited_at: Option<Instant> = None;
        let mut status = None;
        while !pipes.is_empty() || exited_at.is_none() {
            let timeout = match exited_at {
                Some(t) => {
                    let grace = if self.leaf_killed.load(Ordering::SeqCst) { KILLED_GRACE } else { EXIT_GRACE };
                    let left = grace.saturating_sub(t.elapsed());
                    if left.is_zero() {
                        break;
                    }
                    left.as_millis() as i32 + 1
                }
                None if exit_fd.is_none() => 50, // no pidfd (kernel < 5.3): poll the exit
                None => -1,
            };
            let mut fds: Vec<sys::PollFd> =
                pipes.iter().map(|(f, _)| sys::PollFd { fd: f.as_raw_fd(), events: sys::POLLIN, revents: 0 }).collect();
            if exited_at.is_none() {
                if let Some(e) = &exit_fd {
                    fds.push(sys::PollFd { fd: e.as_raw_fd(), events: sys::POLLIN, revents: 0 });
                }
            }
            if sys::poll_fds(&mut fds, timeout).is_err() {
                break;
            }
            if exited_at.is_none() {
                let ready = exit_fd.is_none() || fds.last().map_or(false, |p| p.revents != 0);
                if ready {
                    if let Ok(Some(st)) = child.try_wait() {
                        status = Some(st);
                        exited_at = Some(Instant::now());
                    }
                }
            }
            let mut closed = Vec::new();
            for (k, (pipe, stream)) in pipes.iter_mut().enumerate() {
                if fds[k].revents == 0 {
                    continue;
                }
                match pipe.read(&mut buf) {
                    Ok(n) if n > 0 => self.emit(*stream, &buf[..n]),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    _ => closed.push(k),
                }
            }
            for k in closed.into_iter().rev() {
                pipes.remove(k);
            }
        }
        let status = match status {
            Some(s) => s,
            None => child.wait().expect("wait for a child of ours"),
        };
        let end = exited_at.unwrap_or_else(Instant::now);
        if self.leaf_killed.load(Ordering::SeqCst) {
            if let (Some(cg), Some(leaf)) = (&self.cgroups, self.leaf.lock().unwrap_or_else(|e| e.into_inner()).clone()) {
                cg.wait_empty(&leaf, end + KILLED_GRACE);
            }
        }
        self.finish(status, end, table);
        while !pipes.is_empty() {
            let mut fds: Vec<sys::PollFd> =
                pipes.iter().map(|(f, _)| sys::PollFd { fd: f.as_raw_fd(), events: sys::POLLIN, revents: 0 }).collect();
            if sys::poll_fds(&mut fds, -1).is_err() {
                break;
            }
            let mut closed = Vec::new();
            for (k, (pipe, stream)) in pipes.iter_mut().enumerate() {
                if fds[k].revents == 0 {
                    continue;
                }
                match pipe.read(&mut buf) {
                    Ok(n) if n > 0 => self.inner.lock().unwrap_or_else(|e| e.into_inner()).rings[*stream as usize].append(&buf[..n]),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    _ => closed.push(k),
                }
            }
            for k in closed.into_iter().rev() {
                pipes.remove(k);
            }
        }
        self.close_stdin();
        let leaf = self.leaf.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let (Some(cg), Some(leaf)) = (&self.cgroups, leaf) {
            cg.release(leaf);
        }
    }

    fn finish(self: &Arc<Self>, status: std::process::ExitStatus, end: Instant, table: &ProcTable) {
        let (code, signal) = match (status.code(), status.signal()) {
            (Some(c), _) => (c, None),
            (None, Some(s)) => (128 + s, Some(s)),
            _ => (0, None),
        };
        let ms = end.duration_since(self.t0).as_secs_f64() * 1000.0;
        let info = ExitInfo {
            code,
            signal,
            timed_out: self.timed_out.load(Ordering::SeqCst),
            duration_ms: (ms * 1000.0).round() / 1000.0,
        };
        let sinks = {
            let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            inner.info = Some(info.clone());
            std::mem::take(&mut inner.sinks)
        };
        *self.done.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.done_cv.notify_all();
        for s in sinks {
            if !s.closed() {
                s.finish(&info);
            }
        }
        table.finished(self);
    }

    /// One thread per deadline, blocked in a timed wait: it wakes once, at the deadline or
    /// when the process is done, and costs nothing in between.
    fn set_timeout(self: &Arc<Self>, after: Duration) {
        let p = self.clone();
        let _ = std::thread::Builder::new().stack_size(64 * 1024).spawn(move || {
            let g = p.done.lock().unwrap_or_else(|e| e.into_inner());
            let (g, _) = p.done_cv.wait_timeout_while(g, after, |done| !*done).unwrap_or_else(|e| e.into_inner());
            if !*g {
                drop(g);
                if p.info().is_none() {
                    p.timed_out.store(true, Ordering::SeqCst);
                    p.kill_tree(sys::SIGKILL);
                }
            }
        });
    }
}

fn into_fd<T: std::os::unix::io::IntoRawFd>(t: T) -> i32 {
    t.into_raw_fd()
}

pub struct Spec<'a> {
    pub argv: &'a [String],
    pub display: String,
    pub env: Option<Vec<(String, String)>>,
    pub cwd: Option<String>,
    pub stdin: bool,
    pub background: bool,
    pub timeout: Option<Duration>,
    pub user: Option<User>,
    /// A terminal of (cols, rows) as stdin, stdout and stderr, and the controlling tty.
    pub tty: Option<(u16, u16)>,
}

/// pid -> process in the order they were added, as the reference's dict lists them in
/// `procs` (a few hundred entries at most: a linear search is fine).
#[derive(Default)]
struct Ordered(Vec<(i32, Arc<Proc>)>);

impl Ordered {
    fn insert(&mut self, pid: i32, p: Arc<Proc>) {
        match self.0.iter_mut().find(|(k, _)| *k == pid) {
            Some(e) => e.1 = p,
            None => self.0.push((pid, p)),
        }
    }
    fn get(&self, pid: &i32) -> Option<&Arc<Proc>> {
        self.0.iter().find(|(k, _)| k == pid).map(|(_, p)| p)
    }
    fn remove(&mut self, pid: &i32) {
        self.0.retain(|(k, _)| k != pid);
    }
    fn values(&self) -> impl Iterator<Item = &Arc<Proc>> {
        self.0.iter().map(|(_, p)| p)
    }
}

struct Table {
    procs: Ordered,
    finished: Vec<Arc<Proc>>,
}

pub struct ProcTable {
    default_cwd: Option<String>,
    cgroups: Option<Arc<Cgroups>>,
    t: Mutex<Table>,
}

impl ProcTable {
    pub fn new(default_cwd: Option<String>, cgroups: Option<Cgroups>) -> ProcTable {
        ProcTable { default_cwd, cgroups: cgroups.map(Arc::new), t: Mutex::new(Table { procs: Ordered::default(), finished: Vec::new() }) }
    }

    /// Start a process in a new session, as `user` if given (the child sets its groups, gid
    /// and uid before exec).
    pub fn start(&self, spec: Spec) -> io::Result<Arc<Proc>> {
        let mut env: Vec<(String, String)> = DEFAULT_ENV.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let mut set = |k: &str, v: &str| match env.iter_mut().find(|(ek, _)| ek == k) {
            Some(e) => e.1 = v.to_string(),
            None => env.push((k.to_string(), v.to_string())),
        };
        if let Some(u) = &spec.user {
            set("HOME", &u.home);
            set("USER", &u.name);
            set("LOGNAME", &u.name);
        }
        if let Some(extra) = &spec.env {
            for (k, v) in extra {
                set(k, v);
            }
        }
        let mut cmd = Command::new(&spec.argv[0]);
        cmd.args(&spec.argv[1..]).env_clear().envs(env);
        if let Some(cwd) = spec.cwd.as_ref().or(self.default_cwd.as_ref()) {
            cmd.current_dir(cwd);
        }
        let mut master: Option<File> = None;
        if let Some((cols, rows)) = spec.tty {
            let (m, slave) = sys::open_pty()?;
            sys::set_winsize(m.as_raw_fd(), cols, rows);
            if let Some(u) = &spec.user {
                sys::fchown_uid(slave.as_raw_fd(), u.uid)?; // the user's terminal, as login(1) leaves it
            }
            cmd.stdin(Stdio::from(slave.try_clone()?));
            cmd.stdout(Stdio::from(slave.try_clone()?));
            cmd.stderr(Stdio::from(slave));
            master = Some(m);
        } else {
            cmd.stdin(if spec.stdin { Stdio::piped() } else { Stdio::null() });
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        }
        let tty = spec.tty.is_some();
        let ids = spec.user.as_ref().map(|u| (u.uid, u.gid, u.groups.clone()));
        let leaf = self.cgroups.as_ref().and_then(|cg| cg.take_leaf());
        let procs_file = leaf.as_ref().and_then(|l| {
            OpenOptions::new().write(true).custom_flags(0o2000000).open(format!("{}/cgroup.procs", l)).ok()
        });
        let procs_fd = procs_file.as_ref().map(|f| f.as_raw_fd());
        unsafe {
            cmd.pre_exec(move || {
                if let Some(fd) = procs_fd {
                    // "0" moves the writer: the child is in its leaf before it execs.
                    sys::child_write(fd, b"0");
                }
                sys::child_setsid()?;
                if tty {
                    sys::child_take_ctty()?;
                }
                if let Some((uid, gid, groups)) = &ids {
                    sys::child_setgroups(groups)?;
                    sys::child_setgid(*gid)?;
                    sys::child_setuid(*uid)?;
                }
                Ok(())
            });
        }
        let t0 = Instant::now();
        let spawned = cmd.spawn();
        drop(procs_file);
        let (leaf, cgroups) = match (&self.cgroups, leaf, procs_fd) {
            (Some(cg), Some(l), Some(_)) => (Some(l), Some(cg.clone())),
            (Some(cg), Some(l), None) => {
                cg.release(l);
                (None, None)
            }
            _ => (None, None),
        };
        let mut child = match spawned {
            Ok(c) => c,
            Err(e) => {
                if let (Some(cg), Some(l)) = (&cgroups, leaf) {
                    cg.release(l);
                }
                return Err(e);
            }
        };
        let mut pipes: Vec<(File, Stream)> = Vec::new();
        let stdin = match master {
            // One descriptor of the master for output, another for keystrokes: closing one
            // (the process ended) leaves the other.
            Some(m) => {
                let keys = m.try_clone()?;
                pipes.push((m, Stream::Stdout));
                Some(keys)
            }
            None => {
                if let Some(p) = child.stdout.take() {
                    pipes.push((unsafe { File::from_raw_fd(into_fd(p)) }, Stream::Stdout));
                }
                if let Some(p) = child.stderr.take() {
                    pipes.push((unsafe { File::from_raw_fd(into_fd(p)) }, Stream::Stderr));
                }
                child.stdin.take().map(|p| unsafe { File::from_raw_fd(into_fd(p)) })
            }
        };
        let out_cap = if tty { PTY_RING_BYTES } else { RING_BYTES };
        let wall = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
        let proc = Arc::new(Proc {
            pid: child.id() as i32,
            display: spec.display,
            background: AtomicBool::new(spec.background),
            started_wall: wall,
            t0,
            tty,
            pipes: Mutex::new(pipes),
            inner: Mutex::new(Inner {
                rings: [Ring::new(out_cap), Ring::new(RING_BYTES)],
                sinks: Vec::new(),
                info: None,
            }),
            stdin: Mutex::new(stdin),
            timed_out: AtomicBool::new(false),
            done: Mutex::new(false),
            done_cv: Condvar::new(),
            io: Mutex::new(Some(child)),
            cgroups,
            leaf: Mutex::new(leaf),
            leaf_killed: AtomicBool::new(false),
        });
        self.t.lock().unwrap_or_else(|e| e.into_inner()).procs.insert(proc.pid, proc.clone());
        if let Some(after) = spec.timeout {
            proc.set_timeout(after);
        }
        Ok(proc)
    }

    fn finished(&self, proc: &Arc<Proc>) {
        let mut t = self.t.lock().unwrap_or_else(|e| e.into_inner());
        if !proc.background.load(Ordering::SeqCst) {
            t.procs.remove(&proc.pid);
            return;
        }
        if !t.finished.iter().any(|p| Arc::ptr_eq(p, proc)) {
            t.finished.push(proc.clone());
        }
        while t.finished.len() > MAX_FINISHED {
            let old = t.finished.remove(0);
            if t.procs.get(&old.pid).map_or(false, |p| Arc::ptr_eq(p, &old)) {
                t.procs.remove(&old.pid);
            }
        }
    }

    pub fn get(&self, pid: i128) -> Option<Arc<Proc>> {
        if pid > i32::MAX as i128 {
            return None;
        }
        self.t.lock().unwrap_or_else(|e| e.into_inner()).procs.get(&(pid as i32)).cloned()
    }

    /// A foreground exec lost its host: keep it (and its output) as a background one.
    pub fn to_background(&self, proc: &Arc<Proc>) {
        let mut t = self.t.lock().unwrap_or_else(|e| e.into_inner());
        if proc.background.swap(true, Ordering::SeqCst) {
            return;
        }
        if proc.info().is_some() && !t.finished.iter().any(|p| Arc::ptr_eq(p, proc)) {
            t.procs.insert(proc.pid, proc.clone());
            t.finished.push(proc.clone());
        }
    }

    pub fn kill_all(&self) {
        let procs: Vec<Arc<Proc>> = self.t.lock().unwrap_or_else(|e| e.into_inner()).procs.values().cloned().collect();
        for p in procs {
            if p.info().is_none() {
                p.kill_tree(sys::SIGKILL);
            }
        }
    }

    pub fn live_ttys(&self) -> usize {
        self.list().iter().filter(|p| p.tty && p.info().is_none()).count()
    }

    pub fn list(&self) -> Vec<Arc<Proc>> {
        self.t.lock().unwrap_or_else(|e| e.into_inner()).procs.values().cloned().collect()
    }
}
