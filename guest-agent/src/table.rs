//! The table of managed processes: starting one (new session, cgroup leaf, user, terminal),
//! the running ones and the last finished background ones (guest/procs.py's ProcessTable).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::{AsRawFd, FromRawFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::cgroups::Cgroups;
use crate::program::Program;
use crate::procs::{Inner, Proc, Ring, Stream, DEFAULT_ENV, PTY_RING_BYTES, RING_BYTES};
use crate::sys;
use crate::users::User;

const MAX_FINISHED: usize = 64;

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
            if !u.name.is_empty() {
                set("USER", &u.name);
                set("LOGNAME", &u.name);
            }
        }
        if let Some(extra) = &spec.env {
            for (k, v) in extra {
                set(k, v);
            }
        }
        // The child execs this itself (program.rs); Command only forks and sets up stdio and cwd.
        let program = Program::new(spec.argv, &env)?;
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
                Err(program.exec())
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

    pub(crate) fn finished(&self, proc: &Arc<Proc>) {
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
