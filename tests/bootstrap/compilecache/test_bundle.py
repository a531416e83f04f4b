"""Bundles: deterministic packing, faithful extraction, atomic install, and refusal of hostile archives."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest
import zstandard

from nodewarm.bootstrap.compilecache import bundle
from nodewarm.bootstrap.compilecache.bundle import Limits, UnsafeArchive


def _tree(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return root


INDUCTOR = {
    "fxgraph/ab/fabkey/entry0": b"graph",
    "aotautograd/a6/akey/entry0": b"aot",
    "cx/ckernel.so": b"\x7fELF kernel",
    "cx/ckernel.cpp": b"int main(){}",
    "locks/ckernel.lock": b"",
}
VLLM = {
    "torch_aot_compile/" + "8f" * 32 + "/rank_0_0/model": b"aot model",
    "torch_aot_compile/" + "8f" * 32 + "/inductor_cache/fxgraph/zz/fzzkey/e": b"g2",
}


def _hostile(tmp_path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for ti, data in members:
            if data is not None:
                ti.size = len(data)
                tar.addfile(ti, io.BytesIO(data))
            else:
                tar.addfile(ti)
    path = tmp_path / "hostile.tar.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress(raw.getvalue()))
    return path


def _ti(name: str, kind=tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.type, ti.linkname, ti.mode = kind, linkname, 0o644
    return ti


def test_pack_is_deterministic_and_content_addressed(tmp_path):
    a = _tree(tmp_path / "a", INDUCTOR)
    b = _tree(tmp_path / "b", INDUCTOR)
    os.utime(b / "cx/ckernel.so", (1, 1))  # other times and owners must not change the bytes
    (b / "cx/ckernel.cpp").chmod(0o600)
    pa = bundle.pack({"inductor": a}, tmp_path / "a.tar.zst")
    pb = bundle.pack({"inductor": b}, tmp_path / "b.tar.zst")
    assert pa.sha256 == pb.sha256 and (tmp_path / "a.tar.zst").read_bytes() == (tmp_path / "b.tar.zst").read_bytes()
    assert pa.files == 4  # the lock file is not cache content
    (b / "cx/ckernel.so").write_bytes(b"other kernel")
    assert bundle.pack({"inductor": b}, tmp_path / "c.tar.zst").sha256 != pa.sha256


def test_roundtrip_keeps_content_and_exec_bit(tmp_path):
    ind = _tree(tmp_path / "ind", INDUCTOR)
    vroot = _tree(tmp_path / "vllm", VLLM)
    (ind / "cx/ckernel.so").chmod(0o755)
    (ind / "cx/link").symlink_to("ckernel.so")
    packed = bundle.pack({"inductor": ind, "vllm": vroot}, tmp_path / "x.tar.zst")
    out = bundle.extract(packed.path, tmp_path / "out")
    assert out.roots == ("inductor", "vllm") and out.files == packed.files == 6
    for rel, data in INDUCTOR.items():
        if not rel.startswith("locks/"):
            assert (tmp_path / "out/inductor" / rel).read_bytes() == data
    assert os.access(tmp_path / "out/inductor/cx/ckernel.so", os.X_OK)
    assert os.readlink(tmp_path / "out/inductor/cx/link") == "ckernel.so"
    assert not (tmp_path / "out/inductor/locks").exists()


def test_install_renames_into_place_and_never_overwrites(tmp_path):
    staged = _tree(tmp_path / "staged/inductor", INDUCTOR).parent
    existing = _tree(tmp_path / "cache", {"cx/ckernel.so": b"already here", "yy/other.so": b"mine"})
    moved = bundle.install(staged, {"inductor": existing})
    assert (existing / "cx/ckernel.so").read_bytes() == b"already here"
    assert (existing / "fxgraph/ab/fabkey/entry0").read_bytes() == b"graph"
    assert (existing / "yy/other.so").read_bytes() == b"mine"
    assert moved["inductor"][1] == 1  # kept the one file that was already there

    staged2 = _tree(tmp_path / "staged2/inductor", INDUCTOR).parent
    fresh = tmp_path / "fresh/inductor"
    bundle.install(staged2, {"inductor": fresh})
    assert (fresh / "cx/ckernel.cpp").read_bytes() == b"int main(){}"
    assert not (staged2 / "inductor").exists()  # moved by rename, not copied


@pytest.mark.parametrize("members, words", [
    ([(_ti("/etc/passwd"), b"x")], "absolute"),
    ([(_ti("inductor/../../evil"), b"x")], "'..'"),
    ([(_ti("elsewhere/file"), b"x")], "outside the known cache roots"),
    ([(_ti("inductor/l", tarfile.SYMTYPE, "/etc"), None)], "absolute or goes up"),
    ([(_ti("inductor/l", tarfile.SYMTYPE, "../../../etc"), None)], "absolute or goes up"),
    ([(_ti("inductor/a", tarfile.DIRTYPE), None), (_ti("inductor/l", tarfile.SYMTYPE, "a/../.."), None)],
     "absolute or goes up"),
    ([(_ti("inductor/h", tarfile.LNKTYPE, "vllm/x"), None)], "hard link"),
    ([(_ti("inductor/h", tarfile.LNKTYPE, "inductor/missing"), None)], "hard link"),
    ([(_ti("inductor/dev", tarfile.CHRTYPE), None)], "device"),
    ([(_ti("inductor/fifo", tarfile.FIFOTYPE), None)], "device, FIFO"),
    ([(_ti("inductor/f"), b"1"), (_ti("inductor/f"), b"2")], "appears twice"),
])
def test_hostile_archives_are_refused(tmp_path, members, words):
    path = _hostile(tmp_path, members)
    with pytest.raises(UnsafeArchive) as e:
        bundle.extract(path, tmp_path / "out")
    assert words in str(e.value)
    assert e.value.reason == "UnsafeArchive"
    assert not (tmp_path / "etc").exists() and not (tmp_path / "evil").exists()


def test_limits_on_entry_size_total_and_count(tmp_path):
    path = _hostile(tmp_path, [(_ti(f"inductor/f{i}"), b"x" * 100) for i in range(5)])
    with pytest.raises(UnsafeArchive, match="over the 99 limit"):
        bundle.extract(path, tmp_path / "o1", Limits(max_entry_bytes=99))
    with pytest.raises(UnsafeArchive, match="more than 250 bytes"):
        bundle.extract(path, tmp_path / "o2", Limits(max_total_bytes=250))
    with pytest.raises(UnsafeArchive, match="more than 4 entries"):
        bundle.extract(path, tmp_path / "o3", Limits(max_files=4))
    assert bundle.extract(path, tmp_path / "o4", Limits(max_files=5)).files == 5


def test_garbage_and_truncated_archives_are_refused(tmp_path):
    garbage = tmp_path / "g.tar.zst"
    garbage.write_bytes(b"not zstd at all" * 10)
    with pytest.raises(UnsafeArchive, match="not a readable"):
        bundle.extract(garbage, tmp_path / "o1")
    packed = bundle.pack({"inductor": _tree(tmp_path / "ind", INDUCTOR)}, tmp_path / "ok.tar.zst")
    cut = tmp_path / "cut.tar.zst"
    cut.write_bytes(packed.path.read_bytes()[: packed.size // 2])
    with pytest.raises(UnsafeArchive):
        bundle.extract(cut, tmp_path / "o2")


def test_pack_skips_links_that_extraction_would_refuse(tmp_path):
    ind = _tree(tmp_path / "ind", INDUCTOR)
    (ind / "cx/up").symlink_to("../../outside")
    packed = bundle.pack({"inductor": ind}, tmp_path / "x.tar.zst")
    bundle.extract(packed.path, tmp_path / "out")
    assert not (tmp_path / "out/inductor/cx/up").is_symlink()


def test_cache_dirs_from_env(tmp_path):
    dirs = bundle.CacheDirs.from_env({"HOME": str(tmp_path), "TORCHINDUCTOR_CACHE_DIR": "/ind", "USER": "svc"})
    assert dirs.roots() == {"vllm": tmp_path / ".cache/vllm/torch_compile_cache", "inductor": Path("/ind"),
                            "pch": Path("/tmp/torchinductor_svc/precompiled_headers")}
    dirs = bundle.CacheDirs.from_env({"VLLM_CACHE_ROOT": "/v", "TRITON_CACHE_DIR": "/t", "TMPDIR": "/scratch",
                                      "LOGNAME": "vllm"})
    assert dirs.roots() == {"vllm": Path("/v/torch_compile_cache"), "triton": Path("/t"),
                            "pch": Path("/scratch/torchinductor_vllm/precompiled_headers")}
