//! File operations: read_file, write_file, list, stat, mkdir, remove, rename, sync.

use std::fs::{self, File, Metadata, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::agent::{Handler, Shared};
use crate::frame::{Frame, MAX_CHUNK};
use crate::json::{self, Obj};
use crate::op::{arg_bool, arg_int, arg_opt_int, arg_str, Op, OpError, OpResult};
use crate::{osstr, sys};

/// The requests this module answers (agent.rs's dispatch table is made of these).
pub const HANDLERS: &[(&str, Handler)] = &[
    ("read_file", read_file),
    ("write_file", write_file),
    ("list", list_dir),
    ("stat", stat),
    ("mkdir", mkdir),
    ("remove", remove),
    ("rename", rename),
    ("sync", sync),
];

/// A write_file whose host sends nothing for this long is abandoned (ETIMEDOUT).
const WRITE_IDLE_TIMEOUT: Duration = Duration::from_secs(300);
const LIST_FRAME_BYTES: usize = 768 * 1024;
const O_CLOEXEC: i32 = 0o2000000;

fn kind(m: &Metadata) -> &'static str {
    let ft = m.file_type();
    if ft.is_file() {
        "file"
    } else if ft.is_dir() {
        "dir"
    } else if ft.is_symlink() {
        "symlink"
    } else {
        "other"
    }
}

fn info(name: &str, path: &str, m: &Metadata) -> Obj {
    Obj::new()
        .put("name", name)
        .put("path", path)
        .put("type", kind(m))
        .put("size", m.size())
        .put("mode", (m.mode() & 0o7777) as i64)
        .put("mtime", m.mtime() as f64 + m.mtime_nsec() as f64 / 1e9)
}

fn err(path: &str) -> impl Fn(io::Error) -> OpError + '_ {
    move |e| OpError::io(&e, Some(path))
}

pub fn read_file(_: &Arc<Shared>, op: &Arc<Op>, f: &Frame) -> OpResult {
    let h = &f.header;
    let path = arg_str(h, "path", None)?;
    let offset = arg_int(h, "offset", Some(0), 0)?;
    let length = arg_opt_int(h, "length", 0)?;
    let mut file = OpenOptions::new().read(true).custom_flags(O_CLOEXEC).open(&path).map_err(err(&path))?;
    let m = file.metadata().map_err(err(&path))?;
    if m.is_dir() {
        return Err(OpError::new("EISDIR", "Is a directory").with_path(&path));
    }
    if !op.send("file", b"", Obj::new().put("size", m.size())) {
        return Ok(());
    }
    if offset > 0 {
        file.seek(SeekFrom::Start(offset.min(u64::MAX as i128) as u64)).map_err(err(&path))?;
    }
    let mut sent: i128 = 0;
    let mut buf = vec![0u8; MAX_CHUNK];
    while length.map_or(true, |l| sent < l) {
        let want = match length {
            None => MAX_CHUNK,
            Some(l) => (MAX_CHUNK as i128).min(l - sent) as usize,
        };
        let n = op.credit.take(want as u64) as usize;
        if n == 0 || op.is_cancelled() {
            return Ok(());
        }
        let got = read_full(&mut file, &mut buf[..n]).map_err(err(&path))?;
        if got < n {
            op.credit.add((n - got) as u64);
        }
        if got == 0 {
            break;
        }
        if !op.send("data", &buf[..got], Obj::new()) {
            return Ok(());
        }
        sent += got as i128;
    }
    op.send("eof", b"", Obj::new().put("size", sent as i64));
    Ok(())
}

/// As Python's unbuffered read: one read(2) (short reads are fine, the loop goes on).
fn read_full(f: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match f.read(buf) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            r => return r,
        }
    }
}

pub fn write_file(_: &Arc<Shared>, op: &Arc<Op>, f: &Frame) -> OpResult {
    let h = &f.header;
    let path = arg_str(h, "path", None)?;
    let mode = arg_int(h, "mode", Some(0o644), 0)?;
    if mode > 0o7777 {
        return Err(OpError::inval("'mode' must be <= 0o7777"));
    }
    let append = arg_bool(h, "append", false)?;
    if let Some(parent) = Path::new(&path).parent() {
        if !parent.as_os_str().is_empty() {
            create_dirs(parent)?;
        }
    }
    let mut o = OpenOptions::new();
    o.write(true).create(true).mode(mode as u32).custom_flags(O_CLOEXEC);
    if append {
        o.append(true);
    } else {
        o.truncate(true);
    }
    let mut file = o.open(&path).map_err(err(&path))?;
    file.set_permissions(fs::Permissions::from_mode(mode as u32)).map_err(err(&path))?;
    let mut size: u64 = 0;
    loop {
        let item = match op.next_frame(WRITE_IDLE_TIMEOUT) {
            Ok(item) => item,
            Err(()) => return Err(OpError::new("ETIMEDOUT", "no data from host").with_path(&path)),
        };
        let fr = match item {
            Some(fr) => fr,
            None => return Ok(()), // cancelled: the file keeps what was written
        };
        match fr.t.as_str() {
            "data" => {
                file.write_all(&fr.payload).map_err(err(&path))?;
                size += fr.payload.len() as u64;
                op.consumed(fr.payload.len() as u64);
            }
            "eof" => break,
            other => {
                return Err(OpError::new("EPROTO", &format!("unexpected '{}' in write_file", other)).with_path(&path))
            }
        }
    }
    drop(file);
    op.send("written", b"", Obj::new().put("size", size));
    Ok(())
}

/// `mkdir -p` that names the component that failed, as os.makedirs does.
fn create_dirs(dir: &Path) -> Result<(), OpError> {
    fs::create_dir_all(dir).map_err(|e| OpError::io(&e, Some(&dir.to_string_lossy())))
}

fn join(dir: &str, name: &str) -> String {
    if dir.ends_with('/') {
        format!("{}{}", dir, name)
    } else {
        format!("{}/{}", dir, name)
    }
}

pub fn list_dir(_: &Arc<Shared>, op: &Arc<Op>, f: &Frame) -> OpResult {
    let path = arg_str(&f.header, "path", None)?;
    let rd = fs::read_dir(&path).map_err(err(&path))?;
    let mut batch: Vec<String> = Vec::new();
    let mut nbytes = 0;
    for entry in rd {
        let entry = match entry {
            Ok(e) => e,
            Err(e) => return Err(OpError::io(&e, Some(&path))),
        };
        let name = osstr::to_string(entry.file_name().as_bytes());
        let full = join(&path, &name);
        let m = match fs::symlink_metadata(entry.path()) {
            Ok(m) => m,
            Err(_) => continue,
        };
        let item = json::to_string(&info(&name, &full, &m).value());
        if nbytes + item.len() + 2 > LIST_FRAME_BYTES && !batch.is_empty() {
            let payload = format!("[{}]", batch.join(","));
            if !op.send("entries", payload.as_bytes(), Obj::new().put("more", true)) {
                return Ok(());
            }
            batch.clear();
            nbytes = 0;
        }
        nbytes += item.len() + 1;
        batch.push(item);
    }
    let payload = format!("[{}]", batch.join(","));
    op.send("entries", payload.as_bytes(), Obj::new().put("more", false));
    Ok(())
}

pub fn stat(_: &Arc<Shared>, op: &Arc<Op>, f: &Frame) -> OpResult {
    let path = arg_str(&f.header, "path", None)?;
    let follow = arg_bool(&f.header, "follow", true)?;
    let m = if follow { fs::metadata(&path) } else { fs::symlink_metadata(&path) }.map_err(err(&path))?;
    let trimmed = path.trim_end_matches('/');
    let name = match trimmed.rfind('/') {
        Some(i) => &trimmed[i + 1..],
        None => trimmed,
    };
    let name = if name.is_empty() { "/" } else { name };
    op.send("info", b"", info(name, &path, &m));
    Ok(())
}

pub fn mkdir(_: &Arc<Shared>, op: &Arc<Op>, f: &Frame) -> OpResult {
    let path = arg_str(&f.header, "path", None)?;
    if arg_bool(&f.header, "parents", true)? {
        let exists_as_other = fs::metadata(&path).map(|m| !m.is_dir()).unwrap_or(false);
        if exists_as_other {
            return Err(OpError::new("EEXIST", "File exists").with_path(&path));
        }
        create_dirs(Path::new(&path))?;
        if !Path::new(&path).is_dir() {
            return Err(OpError::new("EEXIST", "File exists").with_path(&path));
        }
    } else {
        fs::create_dir(&path).map_err(err(&path))?;
    }
    op.send("ok", b"", Obj::new());
    Ok(())
}

pub fn remove(_: &Arc<Shared>, op: &Arc<Op>, f: &Frame) -> OpResult {
    let path = arg_str(&f.header, "path", None)?;
    let recursive = arg_bool(&f.header, "recursive", false)?;
    if fs::canonicalize(&path).map(|p| p == Path::new("/")).unwrap_or(false) {
        return Err(OpError::inval("refusing to remove /").with_path(&path));
    }
    let m = fs::symlink_metadata(&path).map_err(err(&path))?;
    if m.is_dir() {
        if recursive {
            fs::remove_dir_all(&path).map_err(err(&path))?;
        } else {
            fs::remove_dir(&path).map_err(err(&path))?;
        }
    } else {
        fs::remove_file(&path).map_err(err(&path))?;
    }
    op.send("ok", b"", Obj::new());
    Ok(())
}

pub fn rename(_: &Arc<Shared>, op: &Arc<Op>, f: &Frame) -> OpResult {
    let src = arg_str(&f.header, "src", None)?;
    let dst = arg_str(&f.header, "dst", None)?;
    fs::rename(&src, &dst).map_err(err(&src))?;
    op.send("ok", b"", Obj::new());
    Ok(())
}

pub fn sync(_: &Arc<Shared>, op: &Arc<Op>, _f: &Frame) -> OpResult {
    sys::sync_all();
    op.send("ok", b"", Obj::new());
    Ok(())
}

