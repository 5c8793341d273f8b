"""Layers applied into a root directory: whiteouts, opaque directories, and entries that try
to reach outside the root (`..`, absolute names, symlinks, hard links, device nodes), and the
bounds on what an image unpacks to (a gzip or zstd bomb stops at them)."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path

import pytest
import zstandard

from pandastack.host.images.oci.errors import ImageInvalid, ImageTooLarge, UnsafeLayerEntry
from pandastack.host.images.oci.unpack import (
    MAX_ZSTD_WINDOW,
    UnpackBudget,
    UnpackReport,
    apply_layers,
)
from tests.host.images.oci.layers import (
    Entry,
    device,
    directory,
    file,
    gzipped,
    hardlink,
    symlink,
    tar_bytes,
    zstded,
)

IMAGE = "tests/unpack:1"


def apply(root: Path, *layers: list[Entry], budget: UnpackBudget | None = None,
          gzip: bool = True) -> UnpackReport:
    root.mkdir(exist_ok=True)
    blobs = [(str(n), io.BytesIO(gzipped(layer) if gzip else tar_bytes(layer)))
             for n, layer in enumerate(layers, 1)]
    return apply_layers(blobs, root, budget or UnpackBudget(IMAGE, 1 << 30, 10_000))


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory beside the root that no layer may touch."""
    path = tmp_path / "outside"
    path.mkdir()
    (path / "victim").write_text("untouched")
    return path


def test_whiteouts_remove_lower_entries_and_opaque_keeps_only_its_own_layers(
        tmp_path: Path) -> None:
    root = tmp_path / "root"
    apply(root,
          [directory("etc"), file("etc/a", "1"), file("etc/b", "2"), directory("var"),
           directory("var/lib"), file("var/lib/x", "x"), directory("var/lib/sub"),
           file("var/lib/sub/y", "y"), symlink("etc/link", "a")],
          [file("etc/.wh.a", ""), file("etc/.wh.link", ""), directory("var/lib"),
           file("var/lib/new", "n"), file("var/lib/.wh..wh..opq", ""),
           file("etc/.wh.absent", "")],
          [file("etc/.wh.b", ""), file("etc/b", "again")])  # whiteout then same-layer file
    assert sorted(os.listdir(root / "etc")) == ["b"]
    assert (root / "etc/b").read_text() == "again"
    assert sorted(os.listdir(root / "var/lib")) == ["new"]


def test_later_layers_replace_files_with_directories_and_back(tmp_path: Path) -> None:
    root = tmp_path / "root"
    apply(root, [file("x", "file"), directory("y"), file("y/inner", "i")],
          [directory("x"), file("x/in", "now a dir"), file("y", "now a file")])
    assert (root / "x/in").read_text() == "now a dir"
    assert (root / "y").read_text() == "now a file"


def test_modes_owners_links_and_capabilities_are_kept(tmp_path: Path) -> None:
    root = tmp_path / "root"
    cap = "\x01\x00\x00\x02\x00\x20\x00\x00" + "\x00" * 12  # cap_net_raw, as ping carries
    apply(root, [directory("bin"), file("bin/su", "su", mode=0o4755),
                 file("bin/ping", "ping", mode=0o755,
                      pax={"SCHILY.xattr.security.capability": cap,
                           "SCHILY.xattr.trusted.evil": "no"}),
                 file("home", "h", uid=1000, gid=1001), hardlink("bin/su2", "bin/su"),
                 directory("tmp", mode=0o1777), Entry("fifo", kind=b"6", mode=0o600)])
    assert stat.S_IMODE((root / "bin/su").stat().st_mode) == 0o4755
    assert stat.S_IMODE((root / "tmp").stat().st_mode) == 0o1777
    assert ((root / "home").stat().st_uid, (root / "home").stat().st_gid) == (1000, 1001)
    assert (root / "bin/su2").stat().st_ino == (root / "bin/su").stat().st_ino
    assert stat.S_ISFIFO((root / "fifo").lstat().st_mode)
    assert os.getxattr(root / "bin/ping", "security.capability")[:4] == b"\x01\x00\x00\x02"
    assert "trusted.evil" not in os.listxattr(root / "bin/ping")


def test_dot_dot_is_refused_and_absolute_names_stay_in_the_root(tmp_path: Path,
                                                                outside: Path) -> None:
    root = tmp_path / "root"
    with pytest.raises(UnsafeLayerEntry, match=r"tests/unpack:1: .*'\.\.' component"):
        apply(root, [file("../outside/victim", "owned")])
    with pytest.raises(UnsafeLayerEntry, match=r"'\.\.' component"):
        apply(root, [hardlink("stolen", "../outside/victim")])
    apply(root, [file(f"{outside}/victim", "contained")])
    assert (outside / "victim").read_text() == "untouched"
    assert (root / str(outside).lstrip("/") / "victim").read_text() == "contained"


def test_writes_through_symlinks_resolve_inside_the_root(tmp_path: Path,
                                                         outside: Path) -> None:
    root = tmp_path / "root"
    apply(root,
          [symlink("abs", str(outside)), symlink("rel", "../" * 8 + str(outside).lstrip("/")),
           symlink("victim", f"{outside}/victim"), symlink("loop", "loop")],
          [file("abs/victim", "via absolute"), file("rel/other", "via relative"),
           file("victim", "replaces the symlink")])
    assert (outside / "victim").read_text() == "untouched"
    assert sorted(os.listdir(outside)) == ["victim"]
    inside = root / str(outside).lstrip("/")
    assert (inside / "victim").read_text() == "via absolute"
    assert (inside / "other").read_text() == "via relative"
    assert not (root / "victim").is_symlink()
    assert (root / "victim").read_text() == "replaces the symlink"
    with pytest.raises(UnsafeLayerEntry, match="too many symlinks"):
        apply(root, [file("loop/x", "never")])


def test_a_symlinked_directory_of_a_lower_layer_is_followed_inside_as_usrmerge_needs(
        tmp_path: Path) -> None:
    root = tmp_path / "root"
    apply(root, [directory("usr"), directory("usr/lib"), symlink("lib", "usr/lib")],
          [file("lib/libx.so", "x")])
    assert (root / "usr/lib/libx.so").read_text() == "x"
    assert (root / "lib").is_symlink()


def test_hard_links_name_files_inside_the_root(tmp_path: Path, outside: Path) -> None:
    root = tmp_path / "root"
    with pytest.raises(ImageInvalid, match="stolen"):
        apply(root, [hardlink("stolen", f"{outside}/victim")])  # read as root/<outside>
    assert os.stat(outside / "victim").st_nlink == 1
    with pytest.raises(UnsafeLayerEntry, match="does not exist"):
        apply(root, [symlink("out", str(outside)), hardlink("stolen2", "out/x/victim")])


def test_device_nodes_are_not_made_but_reported(tmp_path: Path) -> None:
    report = apply(tmp_path / "root", [directory("dev"), device("dev/sda"), file("ok", "1")])
    assert report.skipped == ["dev/sda"]
    assert not (tmp_path / "root/dev/sda").exists()


def test_a_gzip_bomb_stops_at_the_bound_without_unpacking_it(tmp_path: Path) -> None:
    bomb = [file("zeros", bytes(256 << 20))]
    compressed = gzipped(bomb)
    assert len(compressed) < 1 << 20  # 256 MiB in well under 1 MiB
    budget = UnpackBudget(IMAGE, 16 << 20, 10_000)
    with pytest.raises(ImageTooLarge, match="tests/unpack:1: unpacks to more than 16777216"):
        apply_layers([("1", io.BytesIO(compressed))], tmp_path, budget)
    assert budget.read <= (16 << 20) + (1 << 20)


def test_the_bounds_hold_across_layers_and_entries(tmp_path: Path) -> None:
    budget = UnpackBudget(IMAGE, 1 << 20, 10_000)
    apply(tmp_path / "a", [file("half", bytes(400 << 10))], budget=budget)
    with pytest.raises(ImageTooLarge):
        apply(tmp_path / "a", [file("more", bytes(700 << 10))], budget=budget)
    many = [file(f"f{n}", "") for n in range(50)]
    with pytest.raises(ImageTooLarge, match="more than 20 files"):
        apply(tmp_path / "b", many, budget=UnpackBudget(IMAGE, 1 << 30, 20))


def test_a_huge_tar_header_is_refused_before_it_is_read_into_memory(tmp_path: Path) -> None:
    header = [file("x", "y", pax={"comment": "z" * (16 << 20)})]
    budget = UnpackBudget(IMAGE, 1 << 30, 100)
    with pytest.raises(ImageTooLarge, match=r"tests/unpack:1: a layer has a \d+-byte tar header"):
        apply_layers([("1", io.BytesIO(gzipped(header)))], tmp_path, budget)
    assert budget.read < 1 << 20  # stopped at the header's own header block
    long_name = "d/" * 200 + "f"  # a GNU long name or pax path of a few hundred bytes is fine
    apply(tmp_path / "root", [file(long_name, "deep")])
    assert (tmp_path / "root" / long_name).read_text() == "deep"


def test_uncompressed_layers_and_bad_streams(tmp_path: Path) -> None:
    apply(tmp_path / "root", [file("plain", "tar")], gzip=False)
    assert (tmp_path / "root/plain").read_text() == "tar"
    with pytest.raises(ImageInvalid, match="not a valid tar stream"):
        apply_layers([("1", io.BytesIO(gzipped([file("x", "y")])[:60]))], tmp_path / "root",
                     UnpackBudget(IMAGE, 1 << 30, 100))
    with pytest.raises(ImageInvalid, match="1 is not a valid zstd stream"):
        # The frame header's reserved bit set.
        apply_layers([("1", io.BytesIO(b"\x28\xb5\x2f\xfd\x08" + bytes(100)))], tmp_path / "root",
                     UnpackBudget(IMAGE, 1 << 30, 100))
    corrupt = bytearray(_raw_frame(tar_bytes([file("x", "y")]), window_log=20))
    corrupt[6] |= 0b110  # the block's type: 3, reserved
    with pytest.raises(ImageInvalid, match="not a valid tar stream: zstd"):
        apply_layers([("1", io.BytesIO(bytes(corrupt)))], tmp_path / "root",
                     UnpackBudget(IMAGE, 1 << 30, 100))


def test_zstd_layers_unpack_as_gzip_ones_do_in_one_frame_or_many(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    lower = [directory("etc"), file("etc/a", "1"), file("etc/b", "2"),
             file("bin-tool", bytes(range(256)) * 512, mode=0o755)]
    chunked = zstded([file("etc/.wh.a", ""), directory("srv"), file("srv/new", "n" * 5000)],
                     frames=(512, 1536, 3072))
    assert chunked.count(b"\x50\x2a\x4d\x18") == 3  # skippable frames between the four
    report = apply_layers([("1", io.BytesIO(zstded(lower))), ("2", io.BytesIO(chunked)),
                           ("3", io.BytesIO(gzipped([file("etc/c", "3")])))],
                          root, UnpackBudget(IMAGE, 1 << 30, 100))
    assert report.skipped == []
    assert sorted(os.listdir(root / "etc")) == ["b", "c"]
    assert (root / "srv/new").read_text() == "n" * 5000
    assert (root / "bin-tool").read_bytes() == bytes(range(256)) * 512
    assert stat.S_IMODE((root / "bin-tool").stat().st_mode) == 0o755


class _Zeros:
    def __init__(self, size: int) -> None:
        self.left = size

    def read(self, size: int = -1) -> bytes:
        count = min(self.left, size if size >= 0 else self.left)
        self.left -= count
        return bytes(count)


def test_a_zstd_bomb_stops_at_the_bound_and_a_huge_window_is_refused(tmp_path: Path) -> None:
    out = io.BytesIO()
    with zstandard.ZstdCompressor(level=1).stream_writer(out, closefd=False) as writer, \
            tarfile.open(fileobj=writer, mode="w|") as tar:
        info = tarfile.TarInfo("zeros")
        info.size = 1 << 30
        tar.addfile(info, _Zeros(info.size))
    assert len(out.getvalue()) < 1 << 20  # 1 GiB in well under 1 MiB
    budget = UnpackBudget(IMAGE, 16 << 20, 10_000)
    with pytest.raises(ImageTooLarge, match="tests/unpack:1: unpacks to more than 16777216"):
        apply_layers([("1", io.BytesIO(out.getvalue()))], tmp_path, budget)
    assert budget.read <= (16 << 20) + (1 << 20)
    huge_window = _raw_frame(b"", window_log=31)
    assert zstandard.get_frame_parameters(huge_window).window_size == 1 << 31 > MAX_ZSTD_WINDOW
    with pytest.raises(ImageTooLarge, match=r"tests/unpack:1: layer 1 asks for a 2147483648-"
                                            r"byte zstd window \(the bound is 134217728\)"):
        apply_layers([("1", io.BytesIO(huge_window))], tmp_path, budget)
    # Such a frame after a good one: the decoder's own limit refuses it.
    whole = tar_bytes([file("ok", "1")])
    later = zstded([file("ok", "1")], frames=(512,))
    later = later[:later.index(b"\x50\x2a\x4d\x18")] + _raw_frame(whole[512:], window_log=31)
    with pytest.raises(ImageInvalid, match=r"layer 2 is not a valid tar stream: .*memory"):
        apply_layers([("2", io.BytesIO(later))], tmp_path, UnpackBudget(IMAGE, 1 << 30, 100))


def _raw_frame(data: bytes, window_log: int) -> bytes:
    """A zstd frame of one raw (stored) last block whose header asks for a 2^window_log-byte
    window: what a compressor run with that window writes, without allocating it here."""
    assert len(data) < 1 << 17
    header = b"\x28\xb5\x2f\xfd" + bytes([0x00, (window_log - 10) << 3])
    return header + ((len(data) << 3) | 1).to_bytes(3, "little") + data
