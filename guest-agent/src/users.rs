//! The passwd and group files, read directly: a static glibc cannot load NSS modules, and
//! the guest's users live in these files anyway.

use std::fs;

#[derive(Clone)]
pub struct User {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    pub home: String,
}

fn passwd_entries() -> Vec<Vec<String>> {
    fs::read_to_string("/etc/passwd")
        .unwrap_or_default()
        .lines()
        .map(|l| l.split(':').map(str::to_string).collect::<Vec<_>>())
        .filter(|f| f.len() >= 7)
        .collect()
}

/// The entry of a user name, or of a numeric uid (as getpwnam, then getpwuid).
pub fn lookup(name: &str) -> Option<User> {
    let entries = passwd_entries();
    let by_name = entries.iter().find(|f| f[0] == name);
    let f = match by_name {
        Some(f) => f,
        None if !name.is_empty() && name.bytes().all(|c| c.is_ascii_digit()) => {
            let uid: u32 = name.parse().ok()?;
            entries.iter().find(|f| f[2].parse::<u32>().ok() == Some(uid))?
        }
        None => return None,
    };
    let uid = f[2].parse().ok()?;
    let gid = f[3].parse().ok()?;
    Some(User { name: f[0].clone(), uid, gid, groups: group_list(&f[0], gid), home: f[5].clone() })
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
