//! The program a child execs, resolved the way the reference agent's subprocess does it:
//! argv[0] with a '/' as given, else each entry of the child's PATH in turn; execve(2)
//! directly. std's Command ends in execvp(3), which runs a file without a `#!` line through
//! /bin/sh (ENOEXEC); the reference (and spec §5: a non-executable program is 126) does not.

use std::ffi::CString;
use std::io;
use std::os::raw::{c_char, c_int};

extern "C" {
    fn execve(path: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int;
}

const ENOENT: i32 = 2;
const ENOTDIR: i32 = 20;
/// os.defpath: the search path of a child whose environment has no PATH.
const DEFAULT_PATH: &str = "/bin:/usr/bin";

/// Everything the child needs, allocated before the fork: after it, another thread may
/// have held malloc's lock, so the child only reads these.
pub struct Program {
    paths: Vec<CString>,
    _strings: Vec<CString>,
    argv: Vec<*const c_char>,
    envp: Vec<*const c_char>,
}

// The pointers point into `_strings`, whose buffers never move or change.
unsafe impl Send for Program {}
unsafe impl Sync for Program {}

fn cstr(s: String) -> io::Result<CString> {
    CString::new(s).map_err(|_| io::Error::from_raw_os_error(22))
}

impl Program {
    pub fn new(argv: &[String], env: &[(String, String)]) -> io::Result<Program> {
        let prog = argv.first().ok_or_else(|| io::Error::from_raw_os_error(22))?;
        let paths = if prog.contains('/') {
            vec![cstr(prog.clone())?]
        } else {
            let search = env.iter().rev().find(|(k, _)| k == "PATH").map_or(DEFAULT_PATH, |(_, v)| v.as_str());
            // os.path.join: an empty entry is the program itself, a trailing '/' is not doubled.
            search
                .split(':')
                .map(|d| match d {
                    "" => cstr(prog.clone()),
                    d if d.ends_with('/') => cstr(format!("{}{}", d, prog)),
                    d => cstr(format!("{}/{}", d, prog)),
                })
                .collect::<io::Result<Vec<_>>>()?
        };
        let mut strings = Vec::with_capacity(argv.len() + env.len());
        for a in argv {
            strings.push(cstr(a.clone())?);
        }
        for (k, v) in env {
            strings.push(cstr(format!("{}={}", k, v))?);
        }
        let mut ptrs: Vec<*const c_char> = strings.iter().map(|s| s.as_ptr()).collect();
        let mut envp = ptrs.split_off(argv.len());
        ptrs.push(std::ptr::null());
        envp.push(std::ptr::null());
        Ok(Program { paths, _strings: strings, argv: ptrs, envp })
    }

    /// In the child: exec the first candidate that runs. Returns only on failure, with the
    /// first error that is not "not there" (ENOENT, ENOTDIR), else the last one, as
    /// _posixsubprocess reports it.
    pub fn exec(&self) -> io::Error {
        let (mut saved, mut last) = (0, ENOENT);
        for p in &self.paths {
            unsafe { execve(p.as_ptr(), self.argv.as_ptr(), self.envp.as_ptr()) };
            last = io::Error::last_os_error().raw_os_error().unwrap_or(ENOENT);
            if last != ENOENT && last != ENOTDIR && saved == 0 {
                saved = last;
            }
        }
        io::Error::from_raw_os_error(if saved != 0 { saved } else { last })
    }
}
