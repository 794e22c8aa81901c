"""DirectWriter on real files: the bytes, the padding dropped, the plain fallback."""

import os

import pytest

from beam_etl import localio


def _write(path, pieces, buffer_bytes):
    with localio.DirectWriter(str(path), buffer_bytes=buffer_bytes) as out:
        for piece in pieces:
            out.write(piece)
    return out


@pytest.mark.parametrize("sizes", [[], [1], [4095], [4096], [4097], [8192], [8193], [3000] * 7, [20_000, 1, 12_287], [20_001] * 12], ids=str)
def test_the_file_holds_exactly_the_bytes_written(tmp_path, sizes):
    pieces = [os.urandom(n) for n in sizes]
    path = tmp_path / "sub" / "out.bin"  # the folder is made, as FileSystems.create does
    _write(path, pieces, buffer_bytes=8192)
    assert path.read_bytes() == b"".join(pieces)


def test_o_direct_is_used_where_the_filesystem_takes_it(tmp_path):
    probe = tmp_path / "probe"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_DIRECT))
    except (AttributeError, OSError):
        pytest.skip(f"{tmp_path}: no O_DIRECT on this filesystem")
    out = _write(tmp_path / "out.bin", [b"x" * 10_000], buffer_bytes=4096)
    assert out.direct
    assert (tmp_path / "out.bin").read_bytes() == b"x" * 10_000


@pytest.mark.parametrize("sizes", [[4097], [3000] * 7], ids=str)
def test_plain_writes_hold_exactly_the_bytes_written(tmp_path, sizes):
    # The way taken when a filesystem refuses O_DIRECT (at open or at the first write).
    pieces = [os.urandom(n) for n in sizes]
    with localio.DirectWriter(str(tmp_path / "plain.bin"), buffer_bytes=4096, direct=False) as out:
        for piece in pieces:
            out.write(piece)
    assert not out.direct
    assert (tmp_path / "plain.bin").read_bytes() == b"".join(pieces)


def test_an_error_inside_leaves_no_padding_behind(tmp_path):
    path = tmp_path / "half.bin"
    with pytest.raises(RuntimeError):
        with localio.DirectWriter(str(path), buffer_bytes=4096) as out:
            out.write(b"y" * 5000)
            raise RuntimeError("boom")
    assert path.stat().st_size == 4096  # the one full block; the caller deletes the temp file


def test_buffer_must_be_whole_blocks(tmp_path):
    with pytest.raises(ValueError, match="multiple of 4096"):
        localio.DirectWriter(str(tmp_path / "x"), buffer_bytes=5000)


def test_is_local():
    assert localio.is_local("/tmp/x") and localio.is_local("rel/x")
    assert not localio.is_local("gs://bucket/x")


def test_delete_tree_removes_every_file_and_folder_of_a_local_tree(tmp_path):
    from beam_etl import objstore

    root = tmp_path / "staging"
    for i in range(40):  # unlinked on threads, then the folders
        sub = root / "chunks" / f"d{i % 3}"
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"c{i}.tfrecord").write_bytes(os.urandom(5000))
    (root / "one.json").write_text("{}")
    keep = tmp_path / "staging-other"  # a sibling with the same prefix stays
    keep.mkdir()
    (keep / "x").write_text("x")
    objstore.delete_tree(str(root))
    assert not root.exists()
    assert (keep / "x").read_text() == "x"
    with pytest.raises(Exception, match="staging"):  # a folder that is not there is an error, as before
        objstore.delete_tree(str(root))
