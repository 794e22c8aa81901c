"""The staged writer reads each staged byte about once from a bucket: counted by a proxy in front of the store.

Real-sized photos (bench/make_photos.py, ~80 KB each) from local disk to a gs:// output, on the
DirectRunner and on two external SDK workers; every request the converter and its workers send
to the GCS emulator passes through tests/store_proxy.py, which counts them and their bytes.
"""

import json
import os
import sys

import pytest

from tests import objstore_cases as cases
from tests.conftest import ROOT
from tests.objstore_cases import records, run
from tests.store_proxy import StoreProxy
from tests.worker_pool import WorkerPool

PHOTOS = 520
FLAGS = ["--validation_fraction", "0.1", "--num_shards", "train=3,validation=1", "--writer", "staged"]
MAX_READ = 1.2  # bytes read from the store / bytes of the published shards


def _make_photos(root, count: int, smallest: int = 50_000) -> None:
    """`count` photo-like JPEGs of at least `smallest` bytes (bench/make_photos.py's), in 10 class folders."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    try:
        from make_photos import photo
    finally:
        sys.path.pop(0)
    index, made = 0, 0
    while made < count:
        data = photo(index)
        if len(data) >= smallest:
            folder = root / f"class_{made % 10}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"img_{index:06d}.jpg").write_bytes(data)
            made += 1
        index += 1


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """520 photos of 50 KB or more in 10 class folders, and their conversion on local disk."""
    root = tmp_path_factory.mktemp("staged_io") / "photos"
    _make_photos(root, PHOTOS)
    local = root.parent / "local"
    run(None, "beam_etl", "convert", "--input", root, "--output", local, *FLAGS)
    return root, records(None, local), local


@pytest.fixture(scope="module")
def proxy(gcs_server):
    counting = StoreProxy(gcs_server.endpoint)
    yield counting
    counting.close()


def _through(proxy, gcs_server) -> dict:
    return {"STORAGE_EMULATOR_HOST": proxy.url}


def _check(proxy, gcs_server, out, expected):
    counted = proxy.snapshot()
    document = json.loads(gcs_server.read(out + "/dataset.json"))
    shard_bytes = sum(split["bytes"] for split in document["splits"].values())
    assert sum(split["examples"] for split in document["splits"].values()) == PHOTOS
    # Each staged byte is written once and read once; the rest is the chunk indexes (8 bytes a record).
    assert counted["bytes_read"] <= MAX_READ * shard_bytes, (counted, shard_bytes)
    assert counted["by_kind"].get("media GET", 0) < PHOTOS / 4, counted  # a few ranges per chunk, not a GET per record
    assert records(gcs_server, out) == expected
    return counted


def test_direct_runner_reads_each_staged_byte_once(photos, proxy, gcs_server):
    root, expected, _ = photos
    out = "gs://bkt/staged_io/direct"
    proxy.reset()
    run(gcs_server, "beam_etl", "convert", "--input", root, "--output", out, *FLAGS, extra_env=_through(proxy, gcs_server))
    _check(proxy, gcs_server, out, expected)


def test_two_sdk_workers_read_each_staged_byte_once(photos, proxy, gcs_server, tmp_path):
    root, expected, _ = photos
    out = "gs://bkt/staged_io/external"
    env = dict(cases.env(gcs_server), **_through(proxy, gcs_server))
    pool = WorkerPool(str(tmp_path), env)
    try:
        proxy.reset()
        proc = run(gcs_server, "beam_etl", "convert", "--input", root, "--output", out, *FLAGS, *pool.flags(workers=2),
                   extra_env=_through(proxy, gcs_server), timeout=600)
        assert "submitted to PortableRunner" in proc.stderr
    finally:
        pool.close()
    document = json.loads(gcs_server.read(out + "/dataset.json"))
    assert document["worker_processes"] == 2, document["worker_processes"]
    _check(proxy, gcs_server, out, expected)


def test_every_shard_mixes_the_classes_in_proportion(photos):
    # The DirectRunner reads the class folders one after another: the records reach the writer
    # sorted by class, and the spread order of the chunks must still mix every shard.
    from beam_etl import records as record_fns, tfrecord

    _, _, local = photos
    document = json.loads((local / "dataset.json").read_text())
    split = document["splits"]["train"]
    share = {label: n / split["examples"] for label, n in split["label_counts"].items()}
    sizes = []
    for shard in split["shards"]:
        with open(local / shard["file"], "rb") as f:
            keys = [record_fns.key_of(r, document["schema"]) for _, _, r in tfrecord.iter_framed(f)]
        sizes.append(len(keys))
        for label, fraction in share.items():
            found = sum(1 for k in keys if k.startswith(label + "/"))
            assert abs(found - fraction * len(keys)) <= 4, (shard["file"], label, found, fraction * len(keys))  # ±4 of ~15
    assert max(sizes) - min(sizes) <= 1
