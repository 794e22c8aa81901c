"""The Flink topology on one machine: SDK workers in processes of their own, from one worker pool.

Beam's worker pool runs as templates/flink's TaskManager sidecar runs it (tests/worker_pool.py);
`beam-etl convert` submits to the embedded job service with --environment_type=EXTERNAL and two
workers. Inputs and outputs are on the GCS emulator for the equality test, and on local disk
where workers are killed (a larger input, so that a kill lands mid-stage).
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from beam_etl import runners
from tests import objstore_cases as cases
from tests.conftest import ROOT, run_convert
from tests.objstore_cases import FLAGS, INPUTS, last_line, local_summary, records, run
from tests.test_faults import MNIST_FLAGS, records_by_split
from tests.worker_pool import WorkerPool

LEFTOVERS = ("/.staging-", "/tft_tmp", "/beam-temp-")


@pytest.fixture(scope="module")
def pool(gcs_server, tmp_path_factory):
    """Two or more SDK workers come from this pool; it reaches the GCS emulator as the launcher does."""
    pool = WorkerPool(str(tmp_path_factory.mktemp("pool")), cases.env(gcs_server))
    yield pool
    pool.close()


@pytest.fixture(scope="module")
def gs_photos(gcs_server, objstore_photos):
    root, local = objstore_photos
    cases.upload_photos(gcs_server, root, "gs://bkt/external/photos")
    return "gs://bkt/external/photos/", local_summary(local), json.loads((local / "dataset.json").read_text())


@pytest.mark.parametrize("writer", ["staged", "tfrecordio"])
def test_two_sdk_workers_write_what_the_direct_runner_writes(writer, pool, gcs_server, gs_photos):
    source, expected, direct = gs_photos  # direct: the DirectRunner's dataset.json
    out = f"gs://bkt/external/{writer}"
    proc = run(gcs_server, "beam_etl", "convert", "--input", source, "--output", out, *FLAGS, "--writer", writer,
               *pool.flags(workers=2), timeout=600)
    assert "submitted to PortableRunner" in proc.stderr
    document = json.loads(gcs_server.read(out + "/dataset.json"))
    # Two worker processes ran bundles: each left its name (host-pid) in the staging folder.
    assert document["worker_processes"] == 2, document["worker_processes"]
    assert {"worker_0", "worker_1"} <= set(pool.started_workers())
    assert records(gcs_server, out) == expected["records"]
    assert document["label_names"] == expected["label_names"] and document["inputs"] == INPUTS
    assert document["rejected"] == expected["rejected"]
    rejects = sorted((r["key"], r["reason"]) for r in map(json.loads, gcs_server.read(out + "/rejected.jsonl").decode().splitlines()))
    assert rejects == expected["rejects"]
    listed = gcs_server.list(out + "/")
    assert not [u for u in listed if any(mark in u for mark in LEFTOVERS)], listed
    for split, info in direct["splits"].items():
        assert len(document["splits"][split]["shards"]) == len(info["shards"])
        assert document["splits"][split]["label_counts"] == info["label_counts"]
