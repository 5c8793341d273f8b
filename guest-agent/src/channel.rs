//! The byte stream to the host: a virtio-serial port (guest) or an inherited socket (tests).

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::FromRawFd;
use std::time::{Duration, Instant};

pub const PORT_NAME: &str = "org.pandastack.agent";
const READ_SIZE: usize = 256 * 1024;

pub struct Channel {
    file: File,
    /// A host may connect again after a read returned 0 bytes (virtio-serial); a socket's
    /// EOF is final.
    pub reconnects: bool,
    buf: Vec<u8>,
}

extern "C" {
    fn fcntl(fd: i32, cmd: i32, ...) -> i32;
}

impl Channel {
    /// `--fd N`: the socket is inherited, so it is made close-on-exec here, or every
    /// process the agent starts would hold the host's channel open.
    pub fn from_fd(fd: i32) -> Channel {
        unsafe { fcntl(fd, 2 /* F_SETFD */, 1 /* FD_CLOEXEC */) };
        Channel { file: unsafe { File::from_raw_fd(fd) }, reconnects: false, buf: vec![0; READ_SIZE] }
    }

    pub fn open_port(name: &str, wait: Duration) -> io::Result<Channel> {
        let deadline = Instant::now() + wait;
        let mut delay = Duration::from_millis(10);
        loop {
            match find_port(name) {
                Some(path) => match OpenOptions::new().read(true).write(true).custom_flags(0o2000000).open(&path) {
                    Ok(file) => return Ok(Channel { file, reconnects: true, buf: vec![0; READ_SIZE] }),
                    Err(e) if Instant::now() >= deadline => return Err(e),
                    Err(_) => {}
                },
                None if Instant::now() >= deadline => {
                    return Err(io::Error::new(io::ErrorKind::NotFound, format!("no virtio-serial port named {}", name)))
                }
                None => {}
            }
            std::thread::sleep(delay);
            delay = (delay * 2).min(Duration::from_millis(200));
        }
    }

    /// The next bytes; empty when no host is connected (or the socket closed).
    pub fn read(&mut self) -> &[u8] {
        let n = loop {
            match (&self.file).read(&mut self.buf) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => break 0,
            }
        };
        &self.buf[..n]
    }

    pub fn writer(&self) -> io::Result<File> {
        self.file.try_clone()
    }
}

pub fn write_all(f: &File, data: &[u8]) -> io::Result<()> {
    let mut w = f;
    w.write_all(data)
}

fn find_port(name: &str) -> Option<String> {
    let mut entries: Vec<String> = std::fs::read_dir("/sys/class/virtio-ports")
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect();
    entries.sort();
    entries.into_iter().find_map(|e| {
        let text = std::fs::read_to_string(format!("/sys/class/virtio-ports/{}/name", e)).ok()?;
        if text.trim() == name {
            Some(format!("/dev/{}", e))
        } else {
            None
        }
    })
}
