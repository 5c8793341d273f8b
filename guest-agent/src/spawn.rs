//! Starting a child process: clone3(2) straight into its cgroup leaf (CLONE_INTO_CGROUP),
//! then the child's own set-up and execve (program.rs).
//!
//! Why not std's Command: it forks, and the child then moves itself into its leaf by writing
//! `cgroup.procs`, a migration that takes the cgroup threadgroup lock for writing and, after a
//! restore, runs kernel code for the first time under TCG (docs/benchmarks-floor.md). Born in
//! the leaf, the child migrates nowhere. A kernel that refuses CLONE_INTO_CGROUP (before 5.7)
//! gets the old way: a plain clone3 whose child writes "0" to the leaf's `cgroup.procs`.
//!
//! The child shares the agent's memory until it execs (CLONE_VM | CLONE_VFORK, the way the
//! C library's posix_spawn starts one): the calling thread waits meanwhile, and the child
//! makes only system calls, on data prepared before the clone, with no C library locks
//! (another thread of the agent may hold them). Its set-id calls are raw system calls: the
//! C library's wrappers would signal every thread of the agent, which the child is not.

use std::ffi::CString;
use std::fs::OpenOptions;
use std::io;
use std::os::raw::{c_char, c_int, c_long, c_void};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicI32, Ordering};

use crate::program::Program;

const SYS_CLONE3: c_long = 435;
const SYS_SETGROUPS: c_long = 116;
const SYS_SETGID: c_long = 106;
const SYS_SETUID: c_long = 105;
const CLONE_VM: u64 = 0x100;
const CLONE_VFORK: u64 = 0x4000;
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;
/// The child's stack until it execs: its set-up and execve's wrapper need a few KiB.
const CHILD_STACK_BYTES: usize = 64 * 1024;
const SIGCHLD: u64 = 17;
const SIGPIPE: c_int = 13;
const O_CLOEXEC: i32 = 0o2000000;
const O_DIRECTORY: i32 = 0o200000;
const O_PATH: i32 = 0o10000000;
const WNOHANG: c_int = 1;
const EINTR: i32 = 4;
const TIOCSCTTY: u64 = 0x540E;

#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

extern "C" {
    fn syscall(n: c_long, ...) -> c_long;
    fn dup2(old: c_int, new: c_int) -> c_int;
    fn fcntl(fd: c_int, cmd: c_int, ...) -> c_int;
    fn chdir(path: *const c_char) -> c_int;
    fn setsid() -> c_int;
    fn ioctl(fd: c_int, req: u64, ...) -> c_int;
    fn write(fd: c_int, buf: *const c_void, n: usize) -> isize;
    fn signal(sig: c_int, handler: usize) -> usize;
    fn sigprocmask(how: c_int, set: *const [u64; 16], old: *mut [u64; 16]) -> c_int;
    fn waitpid(pid: i32, status: *mut c_int, options: c_int) -> i32;
    fn _exit(code: c_int) -> !;
    fn __errno_location() -> *mut c_int;
}

fn errno() -> i32 {
    unsafe { *__errno_location() }
}

/// A started child; reaped by `wait` or `try_wait`.
pub struct Child {
    pid: i32,
    status: Option<ExitStatus>,
}

impl Child {
    pub fn id(&self) -> u32 {
        self.pid as u32
    }

    pub fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        self.reap(WNOHANG)
    }

    pub fn wait(&mut self) -> io::Result<ExitStatus> {
        loop {
            if let Some(st) = self.reap(0)? {
                return Ok(st);
            }
        }
    }

    fn reap(&mut self, options: c_int) -> io::Result<Option<ExitStatus>> {
        if let Some(st) = self.status {
            return Ok(Some(st));
        }
        let mut raw: c_int = 0;
        let rc = unsafe { waitpid(self.pid, &mut raw, options) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            return if e.raw_os_error() == Some(EINTR) { Ok(None) } else { Err(e) };
        }
        if rc == 0 {
            return Ok(None);
        }
        self.status = Some(ExitStatus::from_raw(raw));
        Ok(self.status)
    }
}

/// What the child does between clone and exec, all prepared before the clone.
pub struct Setup<'a> {
    pub program: &'a Program,
    /// Descriptors that become the child's 0, 1 and 2.
    pub stdio: [i32; 3],
    pub cwd: Option<CString>,
    /// The cgroup leaf directory the child belongs in.
    pub leaf: Option<&'a str>,
    /// The child's stdin is a terminal it takes as its controlling one.
    pub take_ctty: bool,
    pub ids: Option<(u32, u32, Vec<u32>)>,
}

/// The child and whether it is in its leaf (false: in the agent's cgroup; the caller keeps
/// the leaf out of use).
pub fn spawn(setup: &Setup) -> io::Result<(Child, bool)> {
    let leaf = match setup.leaf {
        Some(leaf) => leaf,
        None => return clone_exec(setup, None, None).map(|child| (child, false)),
    };
    let dir = OpenOptions::new().read(true).custom_flags(O_PATH | O_DIRECTORY | O_CLOEXEC).open(leaf);
    if let Ok(dir) = &dir {
        match clone_exec(setup, Some(dir.as_raw_fd()), None) {
            // EINVAL/ENOSYS/E2BIG: a kernel without CLONE_INTO_CGROUP. Any other error is the
            // clone's or the exec's own, and the same without it.
            Err(e) if matches!(e.raw_os_error(), Some(22) | Some(38) | Some(7)) => {}
            other => return other.map(|child| (child, true)),
        }
    }
    let procs = OpenOptions::new().write(true).custom_flags(O_CLOEXEC).open(format!("{}/cgroup.procs", leaf)).ok();
    clone_exec(setup, None, procs.as_ref().map(|f| f.as_raw_fd())).map(|child| (child, procs.is_some()))
}

/// One clone3 and the exec's outcome: Err with the child's errno if it could not exec (it
/// is reaped then). The child shares our memory and runs on a stack of its own until it
/// execs (CLONE_VM | CLONE_VFORK, as posix_spawn does), so nothing of the agent is copied
/// for it and torn down again at its exec, and it reports a failure in shared memory.
fn clone_exec(setup: &Setup, into_cgroup: Option<i32>, procs_fd: Option<i32>) -> io::Result<Child> {
    let mut stack = vec![0u8; CHILD_STACK_BYTES];
    let base = stack.as_mut_ptr() as u64;
    let top = (base + CHILD_STACK_BYTES as u64) & !15;
    let mut args = CloneArgs { flags: CLONE_VM | CLONE_VFORK, exit_signal: SIGCHLD, stack: base,
                               stack_size: top - base, ..Default::default() };
    if let Some(fd) = into_cgroup {
        args.flags |= CLONE_INTO_CGROUP;
        args.cgroup = fd as u64;
    }
    let shared = ChildArgs { setup, procs_fd, failed: AtomicI32::new(0) };
    let all = [!0u64; 16];
    let mut before = [0u64; 16];
    // No signal handler of ours may run on the child's stack before it has reset them.
    let pid = unsafe {
        sigprocmask(0 /* SIG_BLOCK */, &all, &mut before);
        let pid = clone3_vfork(&args, child_entry, &shared as *const ChildArgs as *mut c_void);
        sigprocmask(2 /* SIG_SETMASK */, &before, std::ptr::null_mut());
        pid
    };
    drop(stack);
    if pid < 0 {
        return Err(io::Error::from_raw_os_error(-pid as i32));
    }
    let mut child = Child { pid: pid as i32, status: None };
    let failed = shared.failed.load(Ordering::SeqCst);
    if failed != 0 {
        let _ = child.wait();
        return Err(io::Error::from_raw_os_error(failed));
    }
    Ok(child)
}

struct ChildArgs<'a> {
    setup: &'a Setup<'a>,
    procs_fd: Option<i32>,
    failed: AtomicI32,
}

extern "C" fn child_entry(arg: *mut c_void) -> ! {
    let shared = unsafe { &*(arg as *const ChildArgs) };
    let e = child(shared.setup, shared.procs_fd);
    shared.failed.store(if e == 0 { 8 } else { e }, Ordering::SeqCst);
    unsafe { _exit(127) }
}

/// clone3 whose child calls `entry(arg)` on the stack `args` gives it; returns the child's
/// pid or -errno in the parent. In assembly: the child starts with the new stack at the
/// system call's return, where no compiled code of the parent's frame may run.
unsafe fn clone3_vfork(args: &CloneArgs, entry: extern "C" fn(*mut c_void) -> !, arg: *mut c_void) -> c_long {
    let ret: c_long;
    std::arch::asm!(
        "syscall",
        "test rax, rax",
        "jnz 2f",
        "xor ebp, ebp",
        "mov rdi, r12",
        "call r13",
        "ud2",
        "2:",
        inlateout("rax") SYS_CLONE3 => ret,
        in("rdi") args as *const CloneArgs,
        in("rsi") std::mem::size_of::<CloneArgs>(),
        in("r12") arg,
        in("r13") entry,
        lateout("rcx") _,
        lateout("r11") _,
        options(nostack),
    );
    ret
}

/// In the child: returns only on failure, with the errno to report.
fn child(setup: &Setup, procs_fd: Option<i32>) -> i32 {
    unsafe {
        for (target, &fd) in setup.stdio.iter().enumerate() {
            let target = target as c_int;
            if fd == target {
                if fcntl(fd, 2 /* F_SETFD */, 0) != 0 {
                    return errno();
                }
            } else if dup2(fd, target) < 0 {
                return errno();
            }
        }
        if let Some(cwd) = &setup.cwd {
            if chdir(cwd.as_ptr()) != 0 {
                return errno();
            }
        }
        // What std's Command does too: the agent ignores SIGPIPE and its threads may block
        // signals; a command starts with neither. The disposition first: signals stay blocked
        // (as the parent blocked them for the clone) until nothing of the agent's can run.
        signal(SIGPIPE, 0 /* SIG_DFL */);
        let empty = [0u64; 16];
        sigprocmask(2 /* SIG_SETMASK */, &empty, std::ptr::null_mut());
        if let Some(fd) = procs_fd {
            // "0" moves the writer: the child is in its leaf before it execs.
            write(fd, b"0".as_ptr() as *const c_void, 1);
        }
        if setsid() < 0 {
            return errno();
        }
        if setup.take_ctty && ioctl(0, TIOCSCTTY, 0 as c_long) != 0 {
            return errno();
        }
        if let Some((uid, gid, groups)) = &setup.ids {
            if syscall(SYS_SETGROUPS, groups.len() as c_long, groups.as_ptr()) != 0
                || syscall(SYS_SETGID, *gid as c_long) != 0
                || syscall(SYS_SETUID, *uid as c_long) != 0
            {
                return errno();
            }
        }
    }
    setup.program.exec().raw_os_error().unwrap_or(8)
}
