//! Searches in the agent's own walk (no shell): grep and glob, answering as the reference
//! agent does (src/pandastack/guest/search.py): depth first, each directory's names in byte
//! order, symlinks not followed into directories, unreadable directories skipped.

use std::fs::{self, File};
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;

use crate::agent::{Handler, Shared};
use crate::frame::Frame;
use crate::json::{self, Obj, Value};
use crate::op::{arg_bool, arg_str, Op, OpError, OpResult};
use crate::osstr;

/// The requests this module answers (agent.rs's dispatch table is made of these).
pub const HANDLERS: &[(&str, Handler)] = &[
    ("grep", grep),
    ("glob", glob),
];

// The same bounds as guestproto/ops.py (tests/guest/test_op_table.py holds them to it).
const SEARCH_MAX_PATTERN_BYTES: usize = 1024;
const GREP_MAX_MATCHES: usize = 1000;
const GREP_MAX_LINE_BYTES: usize = 1024;
const GREP_MAX_FILE_BYTES: u64 = 8 * 1024 * 1024;
const GREP_BINARY_PROBE_BYTES: usize = 8192;
const GREP_MAX_TOTAL_BYTES: u64 = 64 * 1024 * 1024;
const GLOB_MAX_PATHS: usize = 10000;
const SEARCH_MAX_ENTRIES: usize = 100000;

fn pattern(f: &Frame) -> Result<String, OpError> {
    let p = arg_str(&f.header, "pattern", None)?;
    let size = osstr::to_bytes(&p).len();
    if p.is_empty() || size > SEARCH_MAX_PATTERN_BYTES {
        return Err(OpError::inval(&format!("'pattern' must be 1..{} bytes", SEARCH_MAX_PATTERN_BYTES)));
    }
    Ok(p)
}

fn join(parent: &str, name: &str) -> String {
    if parent.ends_with('/') {
        format!("{}{}", parent, name)
    } else {
        format!("{}/{}", parent, name)
    }
}

/// (name, is a directory not reached through a symlink), in byte order of the names; empty
/// when unreadable, None when reading it would pass the `left` entries the walk has.
fn children(path: &str, left: &mut usize) -> Option<Vec<(Vec<u8>, String, bool)>> {
    let rd = match fs::read_dir(osstr::path(path)) {
        Ok(rd) => rd,
        Err(_) => return Some(Vec::new()),
    };
    let mut out = Vec::new();
    for entry in rd {
        let entry = match entry {
            Ok(e) => e,
            Err(_) => return Some(Vec::new()),
        };
        if out.len() == *left {
            return None;
        }
        let raw = entry.file_name().as_bytes().to_vec();
        let is_dir = entry.file_type().map(|t| t.is_dir()).unwrap_or(false);
        let name = osstr::to_string(&raw);
        out.push((raw, name, is_dir));
    }
    *left -= out.len();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Some(out)
}

/// Calls `visit(names relative to root, path)` for everything under root, depth first, in
/// order, until it returns false; `descend` says whether to enter a directory. At most
/// SEARCH_MAX_ENTRIES entries are read in all: the directory that would pass them ends the
/// walk, and it returns true (stopped by the bound), as the reference agent's `_Walk` does.
fn walk(op: &Op, root: &str, descend: &dyn Fn(&[String]) -> bool, visit: &mut dyn FnMut(&[String], &str) -> bool) -> bool {
    let mut left = SEARCH_MAX_ENTRIES;
    let mut stack: Vec<(Vec<String>, String, bool)> = Vec::new();
    let (mut parts, mut path, mut is_dir): (Vec<String>, String, bool) = (Vec::new(), root.to_string(), true);
    while !op.is_cancelled() {
        if is_dir && (parts.is_empty() || descend(&parts)) {
            let listed = match children(&path, &mut left) {
                Some(listed) => listed,
                None => return true,
            };
            for (_, name, sub) in listed.into_iter().rev() {
                let mut names = parts.clone();
                names.push(name.clone());
                stack.push((names, join(&path, &name), sub));
            }
        }
        match stack.pop() {
            Some(next) => (parts, path, is_dir) = next,
            None => return false,
        }
        if !visit(&parts, &path) {
            return false;
        }
    }
    false
}

fn finish(op: &Op, items: Vec<Value>, truncated: bool) {
    if op.is_cancelled() {
        return;
    }
    let body = json::to_ascii_string(&Value::Arr(items));
    if op.send_data("data", body.as_bytes()) {
        op.send("eof", b"", Obj::new().put("size", body.len()).put("truncated", truncated));
    }
}

fn is_dir(path: &str) -> Result<bool, OpError> {
    fs::metadata(osstr::path(path)).map(|m| m.is_dir()).map_err(|e| OpError::io(&e, Some(path)))
}

// --- grep ------------------------------------------------------------------------------

struct Grep {
    needle: Vec<u8>,
    fail: Vec<usize>,
    ignore_case: bool,
    matches: Vec<Value>,
    read: u64,
    truncated: bool,
}

/// Knuth-Morris-Pratt: linear in the haystack whatever the needle (a naive scan of 8 MiB
/// for a 1 KiB needle of one repeated byte would take billions of steps).
fn failure_table(needle: &[u8]) -> Vec<usize> {
    let mut fail = vec![0usize; needle.len()];
    let mut k = 0;
    for i in 1..needle.len() {
        while k > 0 && needle[i] != needle[k] {
            k = fail[k - 1];
        }
        if needle[i] == needle[k] {
            k += 1;
        }
        fail[i] = k;
    }
    fail
}

fn find(hay: &[u8], needle: &[u8], fail: &[usize], from: usize) -> Option<usize> {
    let mut k = 0;
    for (i, &b) in hay.iter().enumerate().skip(from) {
        while k > 0 && b != needle[k] {
            k = fail[k - 1];
        }
        if b == needle[k] {
            k += 1;
        }
        if k == needle.len() {
            return Some(i + 1 - k);
        }
    }
    None
}

impl Grep {
    /// Search one file; false once a bound stops the whole grep.
    fn file(&mut self, path: &str) -> bool {
        let m = match fs::metadata(osstr::path(path)) {
            Ok(m) => m,
            Err(_) => return true,
        };
        // An empty file has nothing to find; /proc's files all say 0, and some block.
        if !m.is_file() || m.size() == 0 || m.size() > GREP_MAX_FILE_BYTES {
            return true;
        }
        if self.read + m.size() > GREP_MAX_TOTAL_BYTES {
            self.truncated = true;
            return false;
        }
        let mut data = Vec::new();
        let got = File::open(osstr::path(path)).and_then(|f| f.take(GREP_MAX_FILE_BYTES + 1).read_to_end(&mut data));
        if got.is_err() {
            return true;
        }
        self.read += data.len() as u64;
        let probe = &data[..data.len().min(GREP_BINARY_PROBE_BYTES)];
        if data.len() as u64 > GREP_MAX_FILE_BYTES || probe.contains(&0) {
            return true;
        }
        self.lines(path, &data)
    }

    fn lines(&mut self, path: &str, data: &[u8]) -> bool {
        let lowered;
        let hay: &[u8] = if self.ignore_case {
            lowered = data.to_ascii_lowercase();
            &lowered
        } else {
            data
        };
        let (mut start, mut line, mut counted) = (0usize, 1usize, 0usize);
        while let Some(at) = find(hay, &self.needle, &self.fail, start) {
            let begin = hay[..at].iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
            let end = hay[at..].iter().position(|&b| b == b'\n').map_or(hay.len(), |i| i + at);
            line += hay[counted..begin].iter().filter(|&&b| b == b'\n').count();
            counted = begin;
            if self.matches.len() == GREP_MAX_MATCHES {
                self.truncated = true;
                return false;
            }
            let text = &data[begin..end.min(begin + GREP_MAX_LINE_BYTES)];
            let m = Obj::new().put("path", path).put("line", line).put("text", osstr::to_string(text));
            self.matches.push(m.value());
            start = end + 1;
        }
        true
    }
}

pub fn grep(_: &Arc<Shared>, op: &Arc<Op>, f: &Frame) -> OpResult {
    let path = arg_str(&f.header, "path", None)?;
    let pat = pattern(f)?;
    if pat.contains('\n') {
        return Err(OpError::inval("'pattern' must be one line"));
    }
    let ignore_case = arg_bool(&f.header, "ignore_case", false)?;
    let needle = osstr::to_bytes(&pat);
    let needle = if ignore_case { needle.to_ascii_lowercase() } else { needle };
    let fail = failure_table(&needle);
    let mut g = Grep { needle, fail, ignore_case, matches: Vec::new(), read: 0, truncated: false };
    if is_dir(&path)? {
        let stopped = walk(op, &path, &|_| true, &mut |_, sub| g.file(sub));
        g.truncated |= stopped;
    } else {
        g.file(&path);
    }
    finish(op, g.matches, g.truncated);
    Ok(())
}

// --- glob ------------------------------------------------------------------------------

/// `*` any run of characters, `?` one; every other character stands for itself.
fn name_matches(pattern: &[char], name: &[char]) -> bool {
    let (mut p, mut n) = (0usize, 0usize);
    let (mut star, mut mark): (Option<usize>, usize) = (None, 0);
    while n < name.len() {
        if p < pattern.len() && (pattern[p] == '?' || pattern[p] == name[n]) {
            p += 1;
            n += 1;
        } else if p < pattern.len() && pattern[p] == '*' {
            star = Some(p);
            mark = n;
            p += 1;
        } else if let Some(s) = star {
            p = s + 1;
            mark += 1;
            n = mark;
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&c| c == '*')
}

/// A `**` may match no name: its state also stands at the part after it.
fn closure(parts: &[Vec<char>], states: &mut Vec<bool>) {
    for i in 0..parts.len() {
        if states[i] && is_globstar(&parts[i]) {
            states[i + 1] = true;
        }
    }
}

fn is_globstar(part: &[char]) -> bool {
    part.len() == 2 && part[0] == '*' && part[1] == '*'
}

fn parts_match(parts: &[Vec<char>], names: &[String], prefix: bool) -> bool {
    let mut states = vec![false; parts.len() + 1];
    states[0] = true;
    closure(parts, &mut states);
    for name in names {
        let chars: Vec<char> = name.chars().collect();
        let mut step = vec![false; parts.len() + 1];
        for i in 0..parts.len() {
            if !states[i] {
                continue;
            }
            if is_globstar(&parts[i]) {
                step[i] = true;
            } else if name_matches(&parts[i], &chars) {
                step[i + 1] = true;
            }
        }
        closure(parts, &mut step);
        if !step.iter().any(|&s| s) {
            return false;
        }
        states = step;
    }
    if prefix {
        states[..parts.len()].iter().any(|&s| s)
    } else {
        states[parts.len()]
    }
}

fn split_pattern(pattern: &str) -> Result<Vec<Vec<char>>, OpError> {
    if pattern.starts_with('/') {
        return Err(OpError::inval("'pattern' is relative to 'path'"));
    }
    let mut parts: Vec<Vec<char>> = Vec::new();
    for part in pattern.split('/') {
        let repeated = part == "**" && parts.last().map_or(false, |p| is_globstar(p));
        if part.is_empty() || part == "." || repeated {
            continue;
        }
        parts.push(part.chars().collect());
    }
    if parts.is_empty() {
        return Err(OpError::inval("'pattern' names nothing"));
    }
    Ok(parts)
}

pub fn glob(_: &Arc<Shared>, op: &Arc<Op>, f: &Frame) -> OpResult {
    let path = arg_str(&f.header, "path", None)?;
    let parts = split_pattern(&pattern(f)?)?;
    if !is_dir(&path)? {
        return Err(OpError::new("ENOTDIR", "Not a directory").with_path(&path));
    }
    let mut found: Vec<Value> = Vec::new();
    let mut truncated = false;
    let descend = |names: &[String]| parts_match(&parts, names, true);
    let stopped = walk(op, &path, &descend, &mut |names, sub| {
        if parts_match(&parts, names, false) {
            if found.len() == GLOB_MAX_PATHS {
                truncated = true;
                return false;
            }
            found.push(Value::from(sub));
        }
        true
    });
    finish(op, found, truncated || stopped);
    Ok(())
}
