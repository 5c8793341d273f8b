//! The table of managed processes: starting one (new session, cgroup leaf, user, terminal),
//! the running ones and the last finished background ones (guest/procs.py's ProcessTable).

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::cgroups::Cgroups;
use crate::program::Program;
use crate::spawn;
use crate::procs::{Inner, Proc, Ring, Stream, DEFAULT_ENV, PTY_RING_BYTES, RING_BYTES};
use crate::sys;
use crate::users::User;

const MAX_FINISHED: usize = 64;

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
        let program = Program::new(spec.argv, &env)?;
        let cwd = match spec.cwd.as_ref().or(self.default_cwd.as_ref()) {
            Some(c) => Some(CString::new(c.as_str()).map_err(|_| io::Error::from_raw_os_error(22))?),
            None => None,
        };
        // The child's ends (closed here once it has them) and ours.
        let mut theirs: Vec<File> = Vec::new();
        let mut pipes: Vec<(File, Stream)> = Vec::new();
        let stdin: Option<File>;
        let stdio: [i32; 3];
        if let Some((cols, rows)) = spec.tty {
            let (m, slave) = sys::open_pty()?;
            sys::set_winsize(m.as_raw_fd(), cols, rows);
            if let Some(u) = &spec.user {
                sys::fchown_uid(slave.as_raw_fd(), u.uid)?; // the user's terminal, as login(1) leaves it
            }
            let fd = slave.as_raw_fd();
            stdio = [fd, fd, fd];
            theirs.push(slave);
            // One descriptor of the master for output, another for keystrokes: closing one
            // (the process ended) leaves the other.
            stdin = Some(m.try_clone()?);
            pipes.push((m, Stream::Stdout));
        } else {
            let input = if spec.stdin {
                let (r, w) = sys::pipe()?;
                stdin = Some(w);
                r
            } else {
                stdin = None;
                OpenOptions::new().read(true).write(true).custom_flags(0o2000000).open("/dev/null")?
            };
            let (out_r, out_w) = sys::pipe()?;
            let (err_r, err_w) = sys::pipe()?;
            stdio = [input.as_raw_fd(), out_w.as_raw_fd(), err_w.as_raw_fd()];
            theirs.extend([input, out_w, err_w]);
            pipes.push((out_r, Stream::Stdout));
            pipes.push((err_r, Stream::Stderr));
        }
        let tty = spec.tty.is_some();
        let ids = spec.user.as_ref().map(|u| (u.uid, u.gid, u.groups.clone()));
        let leaf = self.cgroups.as_ref().and_then(|cg| cg.take_leaf());
        let setup = spawn::Setup { program: &program, stdio, cwd, leaf: leaf.as_deref(), take_ctty: tty, ids };
        let t0 = Instant::now();
        let spawned = spawn::spawn(&setup);
        drop(theirs);
        let placed = matches!(spawned, Ok((_, true)));
        let (leaf, cgroups) = match (&self.cgroups, leaf) {
            (Some(cg), Some(l)) if placed => (Some(l), Some(cg.clone())),
            (Some(cg), Some(l)) => {
                cg.release(l);
                (None, None)
            }
            _ => (None, None),
        };
        let child = spawned?.0;
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
