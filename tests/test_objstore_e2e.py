"""Datasets written to gs:// and read from there, against real API servers on 127.0.0.1.

Every command runs as a user runs it, in its own process, with the servers' environment:
convert a prefix into a bucket, then verify, inspect, index, train and bench from it, and
compare the records with a local run over the same files.
"""

import itertools
import json
import subprocess
import sys

import pytest

from tests import objstore_cases as cases
from tests.conftest import ROOT, kill_when
from tests.objstore_cases import FLAGS, INPUTS, last_line, local_summary, records, run
from tests.worker_pool import WorkerPool

LEFTOVERS = ("/.staging-", "/tft_tmp", "/beam-temp-")  # none may remain in a published dataset


@pytest.fixture(scope="module")
def gs_dataset(gcs_server, objstore_photos):
    root, local = objstore_photos
    cases.upload_photos(gcs_server, root, "gs://bkt/src/photos")
    out = "gs://bkt/datasets/v1"
    run(gcs_server, "beam_etl", "convert", "--input", "gs://bkt/src/photos/", "--output", out, *FLAGS)
    return out, local


def test_gs_prefix_to_gs_output_equals_local(gcs_server, gs_dataset):
    out, local = gs_dataset
    names = {uri.rsplit("/", 1)[-1] for uri in gcs_server.list(out + "/")}
    assert {"dataset.json", "rejected.jsonl"} <= names
    assert any(n.startswith("train-") for n in names) and any(n.startswith("validation-") for n in names)
    assert not [u for u in gcs_server.list(out + "/") if any(mark in u for mark in LEFTOVERS)]
    document = json.loads(gcs_server.read(out + "/dataset.json"))
    expected = local_summary(local)
    assert document["label_names"] == expected["label_names"] == ["ant", "bee", "cow"]
    assert document["inputs"] == INPUTS and document["rejected"] == expected["rejected"]
    assert any(u.startswith(out + "/transform_fn/") for u in gcs_server.list(out + "/"))
    assert records(gcs_server, out) == expected["records"]


def test_verify_inspect_index_on_gs(gcs_server, gs_dataset):
    out, _ = gs_dataset
    assert "OK" in run(gcs_server, "beam_etl", "verify", out).stdout
    report = json.loads(run(gcs_server, "beam_etl", "inspect", out, "--json").stdout)
    assert json.dumps(report).count("train") > 0
    run(gcs_server, "beam_etl", "index", out)
    assert any(u.endswith(".tfrecord.idx") for u in gcs_server.list(out + "/"))
    assert "OK" in run(gcs_server, "beam_etl", "verify", out, "--no_decode").stdout


def test_trainer_trains_and_benches_from_gs(gcs_server, gs_dataset, tmp_path):
    out, _ = gs_dataset
    job = tmp_path / "job"
    run(gcs_server, "trainer", "train", "--data_dir", out, "--job_dir", job, "--epochs", "1", "--steps_per_epoch", "2",
        "--batch_size", "4", "--image_size", "32")
    assert (job / "metrics.json").exists()
    proc = run(gcs_server, "trainer", "bench", "--data_dir", out, "--batch_size", "4", "--image_size", "32",
               "--warmup_batches", "1", "--batches", "2")
    assert "img/s" in proc.stdout + proc.stderr or "images/s" in proc.stdout + proc.stderr


def test_killed_publish_to_gs_leaves_no_dataset_json(gcs_server, gs_dataset):
    out = "gs://bkt/datasets/killed"
    cmd = [sys.executable, "-m", "beam_etl", "convert", "--input", "gs://bkt/src/photos/", "--output", out, *FLAGS]
    proc = subprocess.Popen(cmd, env=cases.env(gcs_server), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    published = lambda: any(u.endswith(".tfrecord") for u in gcs_server.list(out + "/") if "/.staging-" not in u)  # noqa: E731
    killed = kill_when(proc, published, timeout=600)  # the publish has begun
    assert killed, "the publish was never seen: the run finished or hung before it"
    assert not [u for u in gcs_server.list(out + "/") if u.endswith("/dataset.json")]
    run(gcs_server, "beam_etl", "convert", "--input", "gs://bkt/src/photos/", "--output", out, *FLAGS)
    assert not [u for u in gcs_server.list(out + "/") if "/.staging-" in u]
    assert "OK" in run(gcs_server, "beam_etl", "verify", out, "--no_decode").stdout
    assert records(gcs_server, out) == records(gcs_server, gs_dataset[0])


def test_changes_against_a_gs_dataset_reads_only_what_changed(gcs_server, objstore_photos):
    from tests.corpus import jpeg

    root, _ = objstore_photos
    src, out = "gs://bkt/src/ledger", "gs://bkt/datasets/ledger"
    cases.upload_photos(gcs_server, root, src)
    run(gcs_server, "beam_etl", "convert", "--input", src + "/", "--output", out, *FLAGS)
    assert any(u.startswith(out + "/ledger/keys-") for u in gcs_server.list(out + "/"))
    changes = lambda: run(gcs_server, "beam_etl", "changes", "--input", src + "/", "--output", out).stdout.strip().splitlines()[-1]  # noqa: E731
    assert changes() == f"no change: the {INPUTS} inputs are those of {out}; 0 images read"
    gcs_server.upload(src + "/train/ant/img_3.jpg", jpeg(90, 40, seed=300))  # other bytes over an object
    gcs_server.upload(src + "/train/bee/new.jpg", jpeg(50, 40, seed=301))
    assert changes() == (f"changes since {out}: 1 new, 1 changed, 0 relabelled, 0 touched, 0 removed, {INPUTS - 1} unchanged; "
                         "1 images read to tell changed from touched")


@pytest.mark.parametrize("scheme", ["gs", "s3"])
def test_update_of_a_bucket_manifest_dataset_equals_a_full_conversion(scheme, request, tmp_path):
    """convert --update with a manifest in a bucket: objects are stat'ed, not read; the result is a full conversion's.

    On s3://, which TensorFlow cannot read, each version is compared through a local copy.
    """
    from tests.corpus import jpeg
    from tests.test_update import READ_VERSION

    server = request.getfixturevalue("gcs_server" if scheme == "gs" else "s3_server")
    flags3 = list(server.beam_flags) if scheme == "s3" else []  # S3's endpoint and keys
    src, out, full = f"{scheme}://bkt/upd/src", f"{scheme}://bkt/upd/ds", f"{scheme}://bkt/upd/full"
    rows = []
    for i in range(60):
        server.upload(f"{src}/img/{i:03d}.jpg", jpeg(24 + i % 7, 20, seed=i))
        rows.append([f"img/{i:03d}.jpg", "cat" if i % 2 else "dog"])
    put = lambda: server.upload(src + "/m.csv", "".join(f"{p},{label}\n" for p, label in rows).encode())  # noqa: E731
    put()
    flags = ["--validation_fraction", "0.2", "--num_shards", "2", *flags3]
    run(server, "beam_etl", "convert", "--input", src + "/m.csv", "--output", out, *flags)
    copies = itertools.count()

    def read(data_dir, version=0):
        if scheme == "s3":
            local = tmp_path / f"copy{next(copies)}"
            server.download_tree(data_dir, local)
            data_dir = local
        return json.loads(run(server, "-c", READ_VERSION, data_dir, version).stdout)

    before = read(out)
    update = lambda: run(server, "beam_etl", "convert", "--update", "--input", src + "/m.csv", "--output", out, *flags3).stdout  # noqa: E731
    assert update().strip().splitlines()[-1] == f"beam-etl: no change: the 60 inputs are those of {out}; 0 images read; no version written"
    for i in range(60, 65):
        server.upload(f"{src}/img/{i:03d}.jpg", jpeg(30, 30, seed=i))
        rows.append([f"img/{i:03d}.jpg", "cat"])
    for i in (10, 11):
        server.upload(f"{src}/img/{i:03d}.jpg", jpeg(41, 33, seed=1000 + i))
    rows[20][1], rows[21][1] = "cat", "dog"
    rows = [r for r in rows if r[0] not in ("img/030.jpg", "img/031.jpg", "img/032.jpg")]
    put()
    line = next(x for x in update().splitlines() if x.startswith("beam-etl: version 2"))
    assert line.startswith(f"beam-etl: version 2 of {out}: 5 new, 2 changed, 2 relabelled, 0 touched, 3 removed, 53 unchanged; 2 read")
    assert line.endswith("; 7 converted, 2 relabelled without a decode")
    run(server, "beam_etl", "convert", "--input", src + "/m.csv", "--output", full, *flags)
    latest = read(out)  # once: on s3:// each read is a download and a TensorFlow process
    assert latest == read(full) and len(latest) == 62
    assert read(out, 1) == before
    for version in ("1", "2"):
        assert "OK" in run(server, "beam_etl", "verify", out, "--version", version, *flags3).stdout
    listed = server.list(out + "/")
    assert not [u for u in listed if any(mark in u for mark in LEFTOVERS)], listed
    # compact merges both (small) generations into one; gc --keep 1 then leaves only what version 3 names.
    assert "version 3: generations [1, 2] rewritten" in run(server, "beam_etl", "compact", out, *flags3).stdout
    run(server, "beam_etl", "gc", out, "--keep", "1", *flags3)
    listed = server.list(out + "/")
    document = json.loads(server.read(out + "/dataset.json"))
    named = {f"{out}/{s['file']}" for split in document["splits"].values() for s in split["shards"]} | {f"{out}/{f}" for f in document["ledger"]["files"]}
    assert {u for u in listed if u.endswith(".tfrecord") or "/ledger/" in u} == named, listed
    assert not [u for u in listed if "/versions/v0000" in u and "v00003" not in u], listed
    assert read(out) == latest
    assert "OK" in run(server, "beam_etl", "verify", out, *flags3).stdout


@pytest.fixture(scope="module")
def s3_dataset(s3_server, objstore_photos):
    root, local = objstore_photos
    cases.upload_photos(s3_server, root, "s3://bkt/src/photos")
    out = "s3://bkt/datasets/v1"
    run(s3_server, "beam_etl", "convert", "--input", "s3://bkt/src/photos/", "--output", out, *FLAGS, *s3_server.beam_flags)
    return out, local


def test_s3_prefix_to_s3_output_equals_local(s3_server, s3_dataset, tmp_path):
    out, local = s3_dataset
    listed = s3_server.list(out + "/")
    assert not [u for u in listed if any(mark in u for mark in LEFTOVERS)], listed
    assert {out + "/dataset.json", out + "/rejected.jsonl", out + "/transform_fn/saved_model.pb"} <= set(listed)
    copy = tmp_path / "copy"
    s3_server.download_tree(out, copy)  # TF can't read s3:// itself: compare through a local copy
    assert local_summary(copy) == local_summary(local)


def test_verify_inspect_index_on_s3(s3_server, s3_dataset):
    out, _ = s3_dataset
    flags = s3_server.beam_flags
    assert "OK" in run(s3_server, "beam_etl", "verify", out, *flags).stdout
    report = json.loads(run(s3_server, "beam_etl", "inspect", out, "--json", *flags).stdout)
    assert json.dumps(report).count("train") > 0
    run(s3_server, "beam_etl", "index", out, *flags)
    assert any(u.endswith(".tfrecord.idx") for u in s3_server.list(out + "/"))
    assert "OK" in run(s3_server, "beam_etl", "verify", out, "--no_decode", *flags).stdout
    # Flags that are not --s3_* are still refused there.
    proc = run(s3_server, "beam_etl", "verify", out, "--runner=DirectRunner", check=False)
    assert proc.returncode == 2 and "unrecognized arguments: --runner=DirectRunner" in last_line(proc)


def test_trainer_refuses_s3_in_one_line(s3_server, s3_dataset, tmp_path):
    out, _ = s3_dataset
    for command in (["train", "--job_dir", tmp_path / "job"], ["bench"]):
        proc = run(s3_server, "trainer", command[0], "--data_dir", out, *command[1:], check=False)
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert "no s3:// filesystem" in last_line(proc) and "aws s3 sync" in last_line(proc)
        assert "Traceback" not in proc.stderr


def test_s3_output_from_external_sdk_workers(s3_server, objstore_photos, tmp_path):
    """Off the DirectRunner the publishing worker writes the transform graph on its own disk and
    Beam copies it: s3://, which TensorFlow cannot write, works there too (it used to be refused)."""
    root, local = objstore_photos
    out = "s3://bkt/datasets/external"
    pool = WorkerPool(str(tmp_path / "pool"), cases.env(s3_server))
    try:
        proc = run(s3_server, "beam_etl", "convert", "--input", root, "--output", out, *FLAGS, *pool.flags(workers=2),
                   *s3_server.beam_flags, timeout=600)
        assert "submitted to PortableRunner" in proc.stderr
    finally:
        pool.close()
    listed = s3_server.list(out + "/")
    assert not [u for u in listed if any(mark in u for mark in LEFTOVERS)], listed
    copy = tmp_path / "copy"
    s3_server.download_tree(out, copy)
    assert local_summary(copy) == local_summary(local)
    statistics = [json.loads((d / "dataset.json").read_text())["statistics"] for d in (copy, local)]
    assert statistics[0] == statistics[1]  # the worker's graph and the DirectRunner's helper's agree
    assert "OK" in run(None, "beam_etl", "verify", copy).stdout  # the graph reads back, and matches dataset.json
