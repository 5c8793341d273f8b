//! The passwd and group files, read directly: a static glibc cannot load NSS modules, and
//! the guest's users live in these files anyway.

use std::fs;

/// Who a process runs as. `name` is empty for a uid without a passwd entry (no USER or
/// LOGNAME then).
#[derive(Clone)]
pub struct User {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    pub home: String,
}

/// The highest uid or gid a spec may name as a number (Docker's bound; procs.py MAX_ID).
const MAX_ID: u32 = (1 << 31) - 2;

fn passwd_entries() -> Vec<Vec<String>> {
    fs::read_to_string("/etc/passwd")
        .unwrap_or_default()
        .lines()
        .map(|l| l.split(':').map(str::to_string).collect::<Vec<_>>())
        .filter(|f| f.len() >= 7)
        .collect()
}

fn number(text: &str) -> Option<u32> {
    if text.is_empty() || !text.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    text.parse::<u32>().ok().filter(|n| *n <= MAX_ID)
}

/// The entry of a user name, or of a numeric uid (as getpwnam, then getpwuid).
fn entry(name: &str) -> Option<User> {
    let entries = passwd_entries();
    let by_name = entries.iter().find(|f| f[0] == name);
    let f = match by_name {
        Some(f) => f,
        None => {
            let uid = number(name)?;
            entries.iter().find(|f| f[2].parse::<u32>().ok() == Some(uid))?
        }
    };
    let uid = f[2].parse().ok()?;
    let gid = f[3].parse().ok()?;
    Some(User { name: f[0].clone(), uid, gid, groups: group_list(&f[0], gid), home: f[5].clone() })
}

/// Who `spec` names, as Docker reads a USER (procs.py lookup_user): `user` or
/// `user:group`, each a name or a number. A bare uid without a passwd entry is that uid with
/// HOME=/ and gid 0; a group replaces the gid, without the memberships. Err: the message
/// naming what is missing ("no such user: 'x'" / "no such group: 'g'").
pub fn lookup(spec: &str, repr: impl Fn(&str) -> String) -> Result<User, String> {
    let (name, group) = match spec.find(':') {
        Some(i) => (&spec[..i], Some(&spec[i + 1..])),
        None => (spec, None),
    };
    let mut user = match (entry(name), number(name)) {
        (Some(u), _) => u,
        (None, Some(uid)) => User { name: String::new(), uid, gid: 0, groups: Vec::new(), home: "/".to_string() },
        (None, None) => return Err(format!("no such user: {}", repr(name))),
    };
    if let Some(group) = group {
        user.gid = match number(group).or_else(|| group_id(group)) {
            Some(gid) => gid,
            None => return Err(format!("no such group: {}", repr(group))),
        };
        user.groups = Vec::new();
    }
    Ok(user)
}

/// The gid of a group name in /etc/group.
fn group_id(name: &str) -> Option<u32> {
    fs::read_to_string("/etc/group").unwrap_or_default().lines().find_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() >= 3 && f[0] == name {
            f[2].parse::<u32>().ok()
        } else {
            None
        }
    })
}

/// As getgrouplist: the primary group, then every group that lists the user as a member.
fn group_list(name: &str, gid: u32) -> Vec<u32> {
    let mut out = vec![gid];
    for line in fs::read_to_string("/etc/group").unwrap_or_default().lines() {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() < 4 {
            continue;
        }
        if let Ok(g) = f[2].parse::<u32>() {
            if f[3].split(',').any(|m| m == name) && !out.contains(&g) {
                out.push(g);
            }
        }
    }
    out
}

/// The login shell in the passwd entry of `uid`.
pub fn shell_of(uid: u32) -> Option<String> {
    passwd_entries().into_iter().find(|f| f[2].parse::<u32>().ok() == Some(uid)).map(|f| f[6].clone())
}
