//! The few libc calls std does not wrap (static glibc provides them; no crates).

use std::ffi::CStr;
use std::io;
use std::os::raw::{c_char, c_int, c_long};

#[repr(C)]
pub struct PollFd {
    pub fd: c_int,
    pub events: i16,
    pub revents: i16,
}

#[repr(C)]
pub struct Timespec {
    pub tv_sec: i64,
    pub tv_nsec: i64,
}

pub const POLLIN: i16 = 1;
pub const POLLOUT: i16 = 4;
pub const SIGKILL: i32 = 9;
const SYS_PIDFD_OPEN: c_long = 434;

extern "C" {
    fn poll(fds: *mut PollFd, n: u64, timeout: c_int) -> c_int;
    fn syscall(n: c_long, ...) -> c_long;
    fn kill(pid: i32, sig: c_int) -> c_int;
    fn clock_settime(clk: c_int, ts: *const Timespec) -> c_int;
    fn ioctl(fd: c_int, req: u64, ...) -> c_int;
    fn sethostname(name: *const c_char, len: usize) -> c_int;
    fn sync();
    fn strerror(e: c_int) -> *const c_char;
}

fn check(rc: i64) -> io::Result<i64> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// poll(2), retried on EINTR. `timeout_ms` < 0 blocks.
pub fn poll_fds(fds: &mut [PollFd], timeout_ms: i32) -> io::Result<usize> {
    loop {
        let rc = unsafe { poll(fds.as_mut_ptr(), fds.len() as u64, timeout_ms) };
        if rc >= 0 {
            return Ok(rc as usize);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(4) {
            return Err(e);
        }
    }
}

pub fn pidfd_open(pid: i32) -> io::Result<i32> {
    check(unsafe { syscall(SYS_PIDFD_OPEN, pid as c_long, 0 as c_long) } as i64).map(|fd| fd as i32)
}

pub fn kill_pid(pid: i32, sig: i32) -> io::Result<()> {
    check(unsafe { kill(pid, sig) } as i64).map(|_| ())
}

/// To a whole process group; errors (the group is gone) are of no interest to callers.
pub fn killpg(pgid: i32, sig: i32) {
    if pgid > 0 {
        unsafe { kill(-pgid, sig) };
    }
}

pub fn set_realtime(ns: i128) -> io::Result<()> {
    if ns > i64::MAX as i128 * 1_000_000_000 {
        return Err(io::Error::from_raw_os_error(75)); // EOVERFLOW
    }
    let ts = Timespec { tv_sec: (ns / 1_000_000_000) as i64, tv_nsec: (ns % 1_000_000_000) as i64 };
    check(unsafe { clock_settime(0, &ts) } as i64).map(|_| ())
}

pub fn ioctl_ptr(fd: i32, req: u64, arg: *const u8) -> io::Result<()> {
    check(unsafe { ioctl(fd, req, arg) } as i64).map(|_| ())
}

pub fn ioctl_none(fd: i32, req: u64) -> io::Result<()> {
    check(unsafe { ioctl(fd, req, 0 as c_long) } as i64).map(|_| ())
}

pub fn set_hostname(name: &str) -> io::Result<()> {
    check(unsafe { sethostname(name.as_ptr() as *const c_char, name.len()) } as i64).map(|_| ())
}

pub fn sync_all() {
    unsafe { sync() }
}

/// The C library's message, as Python's OSError.strerror carries it.
pub fn strerror_text(e: i32) -> String {
    unsafe { CStr::from_ptr(strerror(e)) }.to_string_lossy().into_owned()
}

/// errno -> its name, as Python's errno.errorcode (the wire carries names).
pub fn errno_name(e: i32) -> &'static str {
    match e {
        1 => "EPERM",
        2 => "ENOENT",
        3 => "ESRCH",
        4 => "EINTR",
        5 => "EIO",
        6 => "ENXIO",
        7 => "E2BIG",
        8 => "ENOEXEC",
        9 => "EBADF",
        10 => "ECHILD",
        11 => "EAGAIN",
        12 => "ENOMEM",
        13 => "EACCES",
        14 => "EFAULT",
        15 => "ENOTBLK",
        16 => "EBUSY",
        17 => "EEXIST",
        18 => "EXDEV",
        19 => "ENODEV",
        20 => "ENOTDIR",
        21 => "EISDIR",
        22 => "EINVAL",
        23 => "ENFILE",
        24 => "EMFILE",
        25 => "ENOTTY",
        26 => "ETXTBSY",
        27 => "EFBIG",
        28 => "ENOSPC",
        29 => "ESPIPE",
        30 => "EROFS",
        31 => "EMLINK",
        32 => "EPIPE",
        33 => "EDOM",
        34 => "ERANGE",
        35 => "EDEADLOCK",
        36 => "ENAMETOOLONG",
        37 => "ENOLCK",
        38 => "ENOSYS",
        39 => "ENOTEMPTY",
        40 => "ELOOP",
        42 => "ENOMSG",
        43 => "EIDRM",
        44 => "ECHRNG",
        45 => "EL2NSYNC",
        46 => "EL3HLT",
        47 => "EL3RST",
        48 => "ELNRNG",
        49 => "EUNATCH",
        50 => "ENOCSI",
        51 => "EL2HLT",
        52 => "EBADE",
        53 => "EBADR",
        54 => "EXFULL",
        55 => "ENOANO",
        56 => "EBADRQC",
        57 => "EBADSLT",
        59 => "EBFONT",
        60 => "ENOSTR",
        61 => "ENODATA",
        62 => "ETIME",
        63 => "ENOSR",
        64 => "ENONET",
        65 => "ENOPKG",
        66 => "EREMOTE",
        67 => "ENOLINK",
        68 => "EADV",
        69 => "ESRMNT",
        70 => "ECOMM",
        71 => "EPROTO",
        72 => "EMULTIHOP",
        73 => "EDOTDOT",
        74 => "EBADMSG",
        75 => "EOVERFLOW",
        76 => "ENOTUNIQ",
        77 => "EBADFD",
        78 => "EREMCHG",
        79 => "ELIBACC",
        80 => "ELIBBAD",
        81 => "ELIBSCN",
        82 => "ELIBMAX",
        83 => "ELIBEXEC",
        84 => "EILSEQ",
        85 => "ERESTART",
        86 => "ESTRPIPE",
        87 => "EUSERS",
        88 => "ENOTSOCK",
        89 => "EDESTADDRREQ",
        90 => "EMSGSIZE",
        91 => "EPROTOTYPE",
        92 => "ENOPROTOOPT",
        93 => "EPROTONOSUPPORT",
        94 => "ESOCKTNOSUPPORT",
        95 => "ENOTSUP",
        96 => "EPFNOSUPPORT",
        97 => "EAFNOSUPPORT",
        98 => "EADDRINUSE",
        99 => "EADDRNOTAVAIL",
        100 => "ENETDOWN",
        101 => "ENETUNREACH",
        102 => "ENETRESET",
        103 => "ECONNABORTED",
        104 => "ECONNRESET",
        105 => "ENOBUFS",
        106 => "EISCONN",
        107 => "ENOTCONN",
        108 => "ESHUTDOWN",
        109 => "ETOOMANYREFS",
        110 => "ETIMEDOUT",
        111 => "ECONNREFUSED",
        112 => "EHOSTDOWN",
        113 => "EHOSTUNREACH",
        114 => "EALREADY",
        115 => "EINPROGRESS",
        116 => "ESTALE",
        117 => "EUCLEAN",
        118 => "ENOTNAM",
        119 => "ENAVAIL",
        120 => "EISNAM",
        121 => "EREMOTEIO",
        122 => "EDQUOT",
        123 => "ENOMEDIUM",
        124 => "EMEDIUMTYPE",
        125 => "ECANCELED",
        126 => "ENOKEY",
        127 => "EKEYEXPIRED",
        128 => "EKEYREVOKED",
        129 => "EKEYREJECTED",
        130 => "EOWNERDEAD",
        131 => "ENOTRECOVERABLE",
        132 => "ERFKILL",
        _ => "EIO",
    }
}

extern "C" {
    fn openpty(master: *mut c_int, slave: *mut c_int, name: *mut c_char, termp: *const u8,
               winp: *const u8) -> c_int;
    fn fchown(fd: c_int, uid: u32, gid: u32) -> c_int;
}

const TIOCSWINSZ: u64 = 0x5414;

/// A new pseudo-terminal: (master, slave), both close-on-exec (the child gets the slave as
/// its stdio by dup2, which clears the flag there).
pub fn open_pty() -> io::Result<(std::fs::File, std::fs::File)> {
    use std::os::unix::io::FromRawFd;
    let (mut m, mut s) = (-1, -1);
    check(unsafe { openpty(&mut m, &mut s, std::ptr::null_mut(), std::ptr::null(), std::ptr::null()) } as i64)?;
    for fd in [m, s] {
        unsafe { fcntl(fd, 2, 1) }; // F_SETFD FD_CLOEXEC
    }
    Ok(unsafe { (std::fs::File::from_raw_fd(m), std::fs::File::from_raw_fd(s)) })
}

extern "C" {
    fn fcntl(fd: c_int, cmd: c_int, ...) -> c_int;
}

pub fn set_winsize(fd: i32, cols: u16, rows: u16) {
    let ws: [u16; 4] = [rows, cols, 0, 0];
    let _ = ioctl_ptr(fd, TIOCSWINSZ, ws.as_ptr() as *const u8);
}

pub fn fchown_uid(fd: i32, uid: u32) -> io::Result<()> {
    check(unsafe { fchown(fd, uid, u32::MAX) } as i64).map(|_| ())
}

pub fn set_nonblocking(fd: i32, on: bool) {
    unsafe {
        let flags = fcntl(fd, 3 /* F_GETFL */);
        if flags >= 0 {
            let want = if on { flags | 0o4000 } else { flags & !0o4000 };
            fcntl(fd, 4 /* F_SETFL */, want);
        }
    }
}

extern "C" {
    fn pipe2(fds: *mut c_int, flags: c_int) -> c_int;
}

/// A pipe, both ends close-on-exec: (read end, write end).
pub fn pipe() -> io::Result<(std::fs::File, std::fs::File)> {
    use std::os::unix::io::FromRawFd;
    let mut fds: [c_int; 2] = [-1, -1];
    check(unsafe { pipe2(fds.as_mut_ptr(), 0o2000000) } as i64)?;
    Ok(unsafe { (std::fs::File::from_raw_fd(fds[0]), std::fs::File::from_raw_fd(fds[1])) })
}
