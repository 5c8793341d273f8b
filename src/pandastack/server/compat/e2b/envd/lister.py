"""Entries with their E2B metadata, and setting it: perl programs run by one root exec.

envd >= 0.6.2 keeps user metadata as `user.e2b.<key>` extended attributes and shows them in
every EntryInfo (set by an upload's `X-Metadata-<key>` headers, or by anything in the
guest). `find` cannot read extended attributes and our images have no getfattr, but every
Debian system has perl-base (Essential), whose `syscall` reaches llistxattr / lgetxattr /
lsetxattr / lremovexattr. LIST prints what `find -printf guestfs.FIND_FORMAT` prints, each
record followed by its metadata (a count, then key and value fields), NUL-terminated;
where perl is missing (exit 127) the caller falls back to `find`, without metadata.
"""

from __future__ import annotations

import re

from ..errors import E2bError

# Syscall numbers by `$Config{archname}` prefix: llistxattr, lgetxattr, lsetxattr,
# lremovexattr (x86_64 and arm64 tables).
_SYSCALLS = "x86_64 => [195, 192, 189, 198], aarch64 => [12, 9, 6, 15]"

_COMMON = r"""
use strict; use Config;
my %X = (%SYSCALLS%);
my ($arch) = $Config{archname} =~ /^(x86_64|aarch64)/;
my $x = $arch ? $X{$arch} : undef;
sub names {
  my ($p) = @_; return () unless $x;
  my $b = "\0" x 65536; my $n = syscall($x->[0], $p, $b, 65536);
  return () if $n <= 0;
  return grep { /^user\.e2b\./ } split /\0/, substr($b, 0, $n);
}
"""

LIST = _COMMON.replace("%SYSCALLS%", _SYSCALLS) + r"""
my $hires = eval { require Time::HiRes; 1 };
my ($depth, $follow, @roots) = @ARGV;
my (%u, %g); my $bad = 0;
sub kind { my $m = ($_[0] & 0170000);
  return $m == 0100000 ? "f" : $m == 0040000 ? "d" : $m == 0120000 ? "l" : $m == 0010000 ? "p"
       : $m == 0140000 ? "s" : $m == 0020000 ? "c" : $m == 0060000 ? "b" : "U"; }
sub meta {
  my ($p) = @_; my @kv;
  for my $k (names($p)) {
    my $v = "\0" x 65536; my $n = syscall($x->[1], $p, $k, $v, 65536);
    next if $n < 0;
    $v = substr($v, 0, $n); $v =~ s/\0//g; (my $key = $k) =~ s/^user\.e2b\.//;
    push @kv, $key, $v;
  }
  return (scalar(@kv) / 2, @kv);
}
sub emit {
  my ($p, $s) = @_;
  my $k = kind($s->[2]); my ($t, $l) = ($k, "");
  if ($k eq "l") { my @t = stat($p); $t = @t ? kind($t[2]) : "N"; $l = readlink($p) // ""; }
  my $o = exists $u{$s->[4]} ? $u{$s->[4]} : ($u{$s->[4]} = (getpwuid($s->[4]))[0] // $s->[4]);
  my $g = exists $g{$s->[5]} ? $g{$s->[5]} : ($g{$s->[5]} = (getgrgid($s->[5]))[0] // $s->[5]);
  print join("\0", $k, $t, $s->[7], sprintf("%o", $s->[2] & 07777), $o, $g,
             sprintf("%.9f", $s->[9]), $l, $p, meta($p)), "\0";
}
sub walk {
  my ($p, $d, $root) = @_;
  my @s = $hires ? (($root && $follow) ? Time::HiRes::stat($p) : Time::HiRes::lstat($p))
                 : (($root && $follow) ? stat($p) : lstat($p));
  if (!@s) { if ($root) { print STDERR "lister: '$p': $!\n"; $bad = 1; } return; }
  emit($p, \@s);
  return unless $d < $depth && kind($s[2]) eq "d";
  opendir(my $dh, $p) or return;
  my @n = sort grep { $_ ne "." && $_ ne ".." } readdir($dh); closedir($dh);
  walk($p eq "/" ? "/$_" : "$p/$_", $d + 1, 0) for @n;
}
walk($_, 0, 1) for @roots;
exit $bad;
"""

# $1 the path, then key and value arguments: the file's `user.e2b.*` become exactly those.
SET = _COMMON.replace("%SYSCALLS%", _SYSCALLS) + r"""
my ($p, %kv) = @ARGV;
if (!$x) { print STDERR "no xattr syscalls known on $Config{archname}\n"; exit 3; }
for my $k (names($p)) {
  (my $key = $k) =~ s/^user\.e2b\.//;
  next if exists $kv{$key};
  syscall($x->[3], $p, $k) == 0 or do { print STDERR "remove $k: $!\n"; exit 1 };
}
for my $key (sort keys %kv) {
  my $v = $kv{$key};
  syscall($x->[2], $p, "user.e2b.$key", $v, length($v), 0) == 0
    or do { print STDERR "set $key: $!\n"; exit 1 };
}
"""

HEADER_PREFIX = "x-metadata-"
PRINTABLE = re.compile(r"^[\x20-\x7e]*$")
MAX_KEY = 246
MAX_TOTAL = 4096
NAMESPACE = "user.e2b."


def metadata_of(headers: list[tuple[bytes, bytes]]) -> dict[str, str] | None:
    """An upload's `X-Metadata-<key>: value` headers (keys lowercased, the first of a repeated
    key kept), checked as envd checks them; None when there are none."""
    found: dict[str, str] = {}
    for raw_name, raw_value in headers:
        name = raw_name.decode("latin-1").lower()
        if not name.startswith(HEADER_PREFIX):
            continue
        key = name[len(HEADER_PREFIX):]
        value = raw_value.decode("latin-1")
        if not key or not PRINTABLE.match(key) or not PRINTABLE.match(value):
            raise E2bError(400, f"metadata key and value must be printable US-ASCII: {key!r}")
        if len(key) > MAX_KEY:
            raise E2bError(400, f"metadata key {key[:40]!r}... is over {MAX_KEY} bytes")
        found.setdefault(key, value)
    total = sum(len(NAMESPACE) + len(k) + len(v) for k, v in found.items())
    if total > MAX_TOTAL:
        raise E2bError(400, f"metadata is {total} bytes, over {MAX_TOTAL}")
    return found or None
