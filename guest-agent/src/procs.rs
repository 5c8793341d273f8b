//! A managed process: output pumping into rings and attached sinks, exit, kill, timeout
//! (guest/procs.py in the reference agent; the table that starts them is table.rs).
//!
//! One I/O loop per process (the exec op's own thread, or a thread of its own for spawn)
//! polls stdout, stderr and a pidfd. Output goes into a capped ring per stream and to the
//! attached sinks; a sink without credit blocks the loop, which blocks the pipe, which
//! blocks the process (plain pipe backpressure).

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::io::{AsRawFd, FromRawFd};
use std::os::unix::process::ExitStatusExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::cgroups::Cgroups;
use crate::json::{Obj, Value};
use crate::spawn::Child;
use crate::sys;
use crate::table::ProcTable;

pub(crate) const RING_BYTES: usize = 1 << 20;
const READ_SIZE: usize = 64 * 1024;
/// After the main process exited, how long descendants may keep its pipes open before the
/// exit is reported anyway.
const EXIT_GRACE: Duration = Duration::from_secs(1);
/// The same once its cgroup was killed: every descendant is dying, but a thousand of them (a
/// fork bomb) take seconds to exit on one TCG vCPU; the exit is reported once they have, so
/// the next exec meets neither them nor the pids limit they still hold.
const KILLED_GRACE: Duration = Duration::from_secs(10);
/// A terminal's ring is smaller than a pipe's: a re-attach repaints a screen, it does not
/// replay a log.
pub(crate) const PTY_RING_BYTES: usize = 256 * 1024;

pub(crate) const DEFAULT_ENV: &[(&str, &str)] = &[
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

pub(crate) struct Ring {
    buf: Vec<u8>,
    dropped: u64,
    cap: usize,
}

impl Ring {
    pub(crate) fn new(cap: usize) -> Ring {
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

pub(crate) struct Inner {
    pub(crate) rings: [Ring; 2],
    pub(crate) sinks: Vec<Arc<dyn Sink>>,
    pub(crate) info: Option<ExitInfo>,
}

pub struct Proc {
    pub pid: i32,
    pub display: String,
    pub background: AtomicBool,
    pub(crate) started_wall: f64,
    pub(crate) t0: Instant,
    /// On a terminal (`pty`): stdin is a second descriptor of its master, stdout the master.
    pub tty: bool,
    pub(crate) inner: Mutex<Inner>,
    pub(crate) stdin: Mutex<Option<File>>,
    pub(crate) pipes: Mutex<Vec<(File, Stream)>>,
    pub(crate) timed_out: AtomicBool,
    pub(crate) done: Mutex<bool>,
    pub(crate) done_cv: Condvar,
    pub(crate) io: Mutex<Option<Child>>,
    pub(crate) cgroups: Option<Arc<Cgroups>>,
    /// The tree's cgroup leaf until it goes back to the pool: a kill after that must not
    /// reach the next exec's tree, so both take this lock.
    pub(crate) leaf: Mutex<Option<String>>,
    pub(crate) leaf_killed: AtomicBool,
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
        if pipes.is_empty() {
            // Reaped, and nothing holds its pipes: the tree has left its leaf (a descendant
            // that let go of them keeps it, and release() lists it as stale). Back in the pool
            // before the exit goes out, so the exec a caller sends on seeing that exit finds
            // it spare (issue 33).
            self.release_leaf();
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
        self.release_leaf();
    }

    fn release_leaf(&self) {
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
    pub(crate) fn set_timeout(self: &Arc<Self>, after: Duration) {
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
