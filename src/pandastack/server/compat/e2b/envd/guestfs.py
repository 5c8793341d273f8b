"""What E2B's envd knows of a file and of its user, answered through our guest operations.

envd runs as root in E2B's guests and acts for a user: relative paths start in that user's
home, and what it creates (uploads, directories, their missing parents) the user owns.
Our guest agent has no owner option, so files and directories a non-root user creates are
made by one small root `exec` (`ensure`) that creates what is missing and `chown`s it: an
upload of at most 1 MiB is written by that exec from its stdin; a bigger one streams
through the agent's `write_file`, which opens the file made for it (truncating, so its
owner stays).

EntryInfo carries owner and group names and E2B's metadata (`user.e2b.*` extended
attributes), which our `stat`/`list` operations do not report: entries come from one exec
of lister.LIST (perl; `find -printf` where an image has no perl), so a `stat` or a whole
`ListDir` to any depth is one round trip. Both need only POSIX sh, coreutils and perl-base
or findutils, which every image we build has (Debian's essential set).
"""

from __future__ import annotations

import posixpath
import re
import stat
import time
from dataclasses import dataclass
from typing import Any

from pandastack.hostport.errors import GuestOSError, HostError
from pandastack.hostport.protocols import SandboxPort
from pandastack.server.web.errors import ApiError

from ..errors import E2bError, as_e2b
from ..target import DEFAULT_USER, SandboxTarget
from .connect import ConnectError, code_of_status
from .lister import LIST, SET

ROOT = "root"
# What a guest user name may be here (Debian's adduser rule, a little wider): anything else
# is refused before it reaches a shell's argv.
USER_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$")
MAX_PATH = 4096
# `find` prints every field NUL-terminated: no file name can break a record.
FIND_FIELDS = ("%y", "%Y", "%s", "%m", "%u", "%g", "%T@", "%l", "%p")
FIND_FORMAT = "".join(f + "\\0" for f in FIND_FIELDS)
# A ListDir of a huge tree is refused rather than held whole in memory.
MAX_LISTING_BYTES = 32 << 20
HELPER_TIMEOUT = 60.0

FILE_TYPES = {"f": "FILE_TYPE_FILE", "d": "FILE_TYPE_DIRECTORY", "l": "FILE_TYPE_SYMLINK"}
_TYPE_BITS = {"f": stat.S_IFREG, "d": stat.S_IFDIR, "l": stat.S_IFLNK, "p": stat.S_IFIFO,
              "s": stat.S_IFSOCK, "c": stat.S_IFCHR, "b": stat.S_IFBLK}

# Exit codes of ENSURE, each one answer.
EXIT_NO_USER = 67
EXIT_EXISTS_DIR = 17
EXIT_EXISTS_OTHER = 18
EXIT_NOT_DIR = 20
EXIT_IS_DIR = 21

# $1 user, $2 what ("file", "dir", "parents" or "stdin"), $3 the absolute path, $4 with
# "stdin" lister.SET and then the metadata's keys and values ("" otherwise). Missing
# parents are made one by one (mode 755) and given to the user, then the file or directory
# itself; a file that exists is given to the user too (envd chowns every upload). "stdin"
# writes the file from stdin then chowns it: a small upload in one exec, whose file events
# are envd's own (create, write, chmod).
ENSURE = r"""
u=$1; kind=$2; t=$3; meta=$4; shift 4
id -u "$u" >/dev/null 2>&1 || exit 67
parents() {
  d=${t%/*}
  set --
  while [ -n "$d" ] && [ ! -e "$d" ] && [ ! -L "$d" ]; do set -- "$d" "$@"; d=${d%/*}; done
  [ -z "$d" ] || [ -d "$d" ] || exit 20
  for x do
    mkdir -m 755 "$x" 2>/dev/null || [ -d "$x" ] || exit 20
    chown "$u:" "$x" || exit 1
  done
}
parents
case $kind in
parents) exit 0 ;;
dir)
  if [ -e "$t" ]; then [ -d "$t" ] && exit 17; exit 18; fi
  mkdir -m 755 "$t" || exit 1
  chown "$u:" "$t" || exit 1 ;;
stdin)
  [ -d "$t" ] && exit 21
  existed=; [ -e "$t" ] && existed=1
  umask 022
  cat > "$t" || exit 1
  chown "$u:" "$t" || exit 1
  # what metadata the file had goes (an upload replaces it); a new file has none
  if [ -n "$meta" ] && { [ -n "$existed" ] || [ $# -gt 0 ]; }; then
    exec perl -e "$meta" "$t" "$@"
  fi ;;
*)
  [ -d "$t" ] && exit 21
  [ -e "$t" ] || : > "$t" || exit 1
  chown "$u:" "$t" || exit 1 ;;
esac
"""


def user_of(target: SandboxTarget, given: str | None = None) -> str:
    """The OS user a call acts for: the request's own (`username`), else Basic auth's, else
    E2B's default. A name that could not be a user is E2B's 401."""
    name = given or target.user or DEFAULT_USER
    if not USER_NAME.match(name):
        raise E2bError(401, f"invalid user {name[:64]!r}")
    return name


def home_of(user: str) -> str:
    # E2B's images and ours keep homes where adduser puts them; no passwd lookup per call.
    return "/root" if user == ROOT else f"/home/{user}"


def resolve(path: str, user: str) -> str:
    """An absolute, normalised path: `~` and relative paths start in the user's home."""
    if "\x00" in path:
        raise E2bError(400, "path must not contain NUL bytes")
    if len(path) > MAX_PATH:
        raise E2bError(400, f"path is over {MAX_PATH} characters")
    home = home_of(user)
    if path == "~" or path.startswith("~/"):
        path = home + path[1:]
    elif not path.startswith("/"):
        path = posixpath.join(home, path)
    clean = posixpath.normpath(path)
    return "/" + clean.lstrip("/")


@dataclass(frozen=True)
class Entry:
    kind: str  # find's %y: f d l p s c b
    target_kind: str  # %Y: the type a symlink leads to (N: nothing, L: a loop)
    size: int
    mode: int
    owner: str
    group: str
    mtime: str
    link: str
    path: str
    metadata: tuple[tuple[str, str], ...] = ()

    @property
    def name(self) -> str:
        return posixpath.basename(self.path) or "/"


def parse_find(output: bytes) -> list[Entry]:
    fields = output.decode("utf-8", "surrogateescape").split("\x00")
    width = len(FIND_FIELDS)
    entries = []
    for i in range(0, len(fields) - width + 1, width):
        y, big_y, size, mode, owner, group, mtime, link, path = fields[i:i + width]
        entries.append(Entry(y, big_y, int(size or 0), int(mode or "0", 8), owner, group,
                             mtime, link, path))
    return entries


def parse_listing(output: bytes) -> list[Entry]:
    """lister.LIST's records: find's fields, then a count and that many key/value pairs."""
    fields = output.decode("utf-8", "surrogateescape").split("\x00")
    width = len(FIND_FIELDS)
    entries = []
    i = 0
    while i + width < len(fields):
        y, big_y, size, mode, owner, group, mtime, link, path = fields[i:i + width]
        count = int(fields[i + width] or 0)
        pairs = fields[i + width + 1:i + width + 1 + 2 * count]
        i += width + 1 + 2 * count
        if len(pairs) < 2 * count:
            break
        entries.append(Entry(y, big_y, int(size or 0), int(mode or "0", 8), owner, group,
                             mtime, link, path,
                             tuple(zip(pairs[::2], pairs[1::2], strict=True))))
    return entries


def timestamp(seconds: str) -> str:
    """find's `%T@` (`1701640491.1234567890`) as protobuf's JSON Timestamp (RFC 3339, UTC)."""
    whole, _, frac = seconds.partition(".")
    try:
        base = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(int(whole)))
    except (ValueError, OverflowError, OSError):
        return "1970-01-01T00:00:00Z"
    digits = frac[:9].rstrip("0")
    return f"{base}.{digits}Z" if digits and digits.isdigit() else f"{base}Z"


def _clean(text: str) -> str:
    """A guest name that is not UTF-8 (surrogate-escaped here) shown with U+FFFD."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def entry_info(entry: Entry) -> dict[str, Any]:
    """EntryInfo in protobuf's JSON mapping. A symlink reads as what it leads to, with its
    target as an absolute path (as envd >= 0.5 answers); a dangling one stays a symlink."""
    kind = entry.kind
    info: dict[str, Any] = {}
    if kind == "l":
        target = entry.link if entry.link.startswith("/") else posixpath.join(
            posixpath.dirname(entry.path), entry.link)
        info["symlinkTarget"] = _clean(posixpath.normpath(target))
        if entry.target_kind in ("f", "d"):
            kind = entry.target_kind
    info.update({
        "name": _clean(entry.name),
        "type": FILE_TYPES.get(kind, "FILE_TYPE_UNSPECIFIED"),
        "path": _clean(entry.path),
        "size": str(entry.size),
        "mode": entry.mode,
        "permissions": stat.filemode(_TYPE_BITS.get(entry.kind, 0) | entry.mode),
        "owner": _clean(entry.owner),
        "group": _clean(entry.group),
        "modifiedTime": timestamp(entry.mtime),
    })
    if entry.metadata:
        info["metadata"] = {_clean(k): _clean(v) for k, v in entry.metadata}
    return info


def _find_failure(stderr: bytes, path: str) -> E2bError:
    text = stderr.decode("utf-8", "replace")
    if "No such file" in text:
        return E2bError(404, f"path '{_clean(path)}' does not exist")
    if "Not a directory" in text:
        return E2bError(400, f"a component of path '{_clean(path)}' is not a directory")
    if "Permission denied" in text:
        return E2bError(403, f"permission denied: '{_clean(path)}'")
    return E2bError(400, f"cannot read '{_clean(path)}': {text.strip()[:300]}")


async def describe(handle: SandboxPort, path: str, depth: int = 0,
                   follow_root: bool = False) -> list[Entry]:
    """`path` (first) and, to `depth`, what is under it, with E2B's metadata (lister.LIST;
    `find` without it where the image has no perl)."""
    res = await handle.exec(["perl", "-e", LIST, str(depth), "1" if follow_root else "0",
                             path], timeout=HELPER_TIMEOUT, max_output=MAX_LISTING_BYTES)
    parse = parse_listing
    if res.exit_code == 127:
        argv = ["find", "-H" if follow_root else "-P", path, "-maxdepth", str(depth),
                "-printf", FIND_FORMAT]
        res = await handle.exec(argv, timeout=HELPER_TIMEOUT, max_output=MAX_LISTING_BYTES)
        parse = parse_find
    if res.truncated:
        raise E2bError(413, f"the listing of '{_clean(path)}' is over "
                       f"{MAX_LISTING_BYTES >> 20} MiB: ask for less depth")
    if res.exit_code == 127:
        raise E2bError(501, "this sandbox's image has neither perl nor find")
    entries = parse(res.stdout)
    if res.exit_code != 0 and (not entries or entries[0].path != path):
        raise _find_failure(res.stderr, path)
    if not entries:
        raise E2bError(404, f"path '{_clean(path)}' does not exist")
    return entries


async def describe_each(handle: SandboxPort, paths: list[str]) -> dict[str, Entry]:
    """What exists of `paths`, by path, in one exec (for watch events' entries)."""
    if not paths:
        return {}
    res = await handle.exec(["perl", "-e", LIST, "0", "0", *paths], timeout=HELPER_TIMEOUT,
                            max_output=MAX_LISTING_BYTES)
    return {e.path: e for e in parse_listing(res.stdout)} if res.exit_code in (0, 1) else {}


async def ensure(handle: SandboxPort, user: str, kind: str, path: str,
                 data: bytes | None = None, metadata: dict[str, str] | None = None) -> None:
    """Make what `kind` needs at `path`, owned by `user` (see ENSURE); `data` (and the
    `metadata` that replaces the file's) for "stdin"."""
    pairs = [x for kv in (metadata or {}).items() for x in kv]
    meta = [SET, *pairs] if kind == "stdin" else [""]
    res = await handle.exec(["sh", "-c", ENSURE, "ensure", user, kind, path, *meta],
                            timeout=HELPER_TIMEOUT, max_output=1 << 16,
                            stdin=data if kind == "stdin" else None)
    shown = _clean(path)
    match res.exit_code:
        case 0:
            return
        case 67:
            raise E2bError(401, f"error looking up user '{user}': unknown user")
        case 17:
            raise E2bError(409, f"directory '{shown}' already exists")
        case 18:
            raise E2bError(400, f"path '{shown}' already exists and is not a directory")
        case 20:
            raise E2bError(400, f"a parent of '{shown}' is not a directory")
        case 21:
            raise E2bError(400, f"path '{shown}' is a directory")
    detail = res.stderr.decode("utf-8", "replace").strip()[:300]
    if "No space" in detail:
        raise E2bError(507, "not enough disk space available")
    if "Permission denied" in detail or "Read-only" in detail:
        raise E2bError(403, f"permission denied: '{shown}'")
    raise E2bError(400, f"cannot create '{shown}': {detail or res.exit_code}")


async def set_metadata(handle: SandboxPort, path: str, metadata: dict[str, str] | None) -> None:
    """The file's E2B metadata becomes exactly `metadata` (none: what it had goes)."""
    pairs = [x for kv in (metadata or {}).items() for x in kv]
    res = await handle.exec(["perl", "-e", SET, path, *pairs], timeout=HELPER_TIMEOUT,
                            max_output=1 << 16)
    if res.exit_code == 127 and not metadata:
        return  # no perl: nothing set metadata either
    if res.exit_code != 0:
        detail = res.stderr.decode("utf-8", "replace").strip()[:300]
        raise E2bError(400, f"cannot set metadata on '{_clean(path)}': "
                       f"{detail or res.exit_code}")


def e2b_error_of(exc: BaseException) -> E2bError | None:
    """Our errors in E2B's status terms, with envd's wording for a missing path."""
    if isinstance(exc, GuestOSError) and exc.errno_name == "ENOENT":
        return E2bError(404, f"path '{_clean(exc.path or '')}' does not exist"
                        if exc.path else "no such file or directory")
    if isinstance(exc, (E2bError, ApiError, HostError)):
        return as_e2b(exc)
    return None


def connect_error_of(exc: BaseException) -> ConnectError | None:
    if isinstance(exc, ConnectError):
        return exc
    found = e2b_error_of(exc)
    if found is None:
        return None
    return ConnectError(code_of_status(found.status), found.message)

