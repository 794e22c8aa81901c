"""Inputs on gs:// and s3:// against real API servers on 127.0.0.1 (tests/objstore_servers.py).

The same photo tree is converted from a local folder, a gs:// prefix and an s3:// prefix into
local outputs, and must give the same records, labels and rejects. Every bad input stops the
run with one line and exit 2 before any encode.
"""

import json
import os
import sys

import pytest

from tests import objstore_cases as cases
from tests.conftest import ROOT
from tests.objstore_cases import FLAGS, INPUTS, last_line, local_summary, run


@pytest.fixture(scope="module")
def gs_photos(gcs_server, objstore_photos):
    root, local = objstore_photos
    cases.upload_photos(gcs_server, root, "gs://bkt/in/photos")
    return "gs://bkt/in/photos/", local


@pytest.fixture(scope="module")
def s3_photos(s3_server, objstore_photos):
    root, local = objstore_photos
    cases.upload_photos(s3_server, root, "s3://bkt/in/photos")
    return "s3://bkt/in/photos/", local


def test_local_reference_has_every_case(objstore_photos):
    _, local = objstore_photos
    summary = local_summary(local)
    assert summary["inputs"] == INPUTS  # hidden files are not inputs
    assert summary["rejects"] == [("train/ant/truncated.jpg", "corrupt"), ("validation/bee/empty.jpg", "empty")]
    keys = {key for split in summary["records"].values() for key in split}
    assert set(cases.AWKWARD) <= keys


def test_gs_prefix_equals_local_folder(gcs_server, gs_photos, tmp_path):
    prefix, local = gs_photos
    run(gcs_server, "beam_etl", "convert", "--input", prefix, "--output", tmp_path / "ds", *FLAGS)
    assert local_summary(tmp_path / "ds") == local_summary(local)


def test_s3_prefix_equals_local_folder(s3_server, s3_photos, tmp_path):
    prefix, local = s3_photos
    # --encode_processes 0: encode in the Beam worker itself, as on Dataflow and Flink; the default
    # (a pool of processes) is covered by the gs:// test and by the fingerprint below.
    run(s3_server, "beam_etl", "convert", "--input", prefix, "--output", tmp_path / "ds", *FLAGS,
        "--encode_processes", "0", *s3_server.beam_flags)
    assert local_summary(tmp_path / "ds") == local_summary(local)
    document = json.loads((tmp_path / "ds" / "dataset.json").read_text())
    fingerprint = run(s3_server, "beam_etl", "fingerprint", "--input", prefix, *s3_server.beam_flags).stdout.strip()
    assert fingerprint == document["source_fingerprint"]


def test_s3_prefix_with_the_encode_pool(s3_server, s3_photos, tmp_path):
    """The pool's processes get the --s3_* flags too, or every read would be a reject."""
    prefix, local = s3_photos
    run(s3_server, "beam_etl", "convert", "--input", prefix + "train/", "--output", tmp_path / "ds",
        "--num_shards", "2", "--encode_processes", "2", "--max_reject_fraction", "0.5", *s3_server.beam_flags)
    document = json.loads((tmp_path / "ds" / "dataset.json").read_text())
    assert document["rejected"]["by_reason"] == {"corrupt": 1}
    assert document["splits"]["train"]["examples"] == 12 + 2


@pytest.mark.parametrize("scheme", ["gs", "s3"])
def test_manifest_in_a_bucket_lists_object_uris(request, scheme, tmp_path):
    server = request.getfixturevalue({"gs": "gcs_server", "s3": "s3_server"}[scheme])
    prefix, _ = request.getfixturevalue(f"{scheme}_photos")
    # Absolute object URIs, a path relative to the manifest's own prefix, and an object that is
    # not there (deleted since the manifest was written): a reject, not a failed job.
    rows = [f"{prefix}train/ant/img_3.jpg,ant,train", f"{prefix}validation/cow/img_14.jpg,cow,validation",
            "photos/train/bee/img_1.jpg,bee,", f"{prefix}train/ant/deleted.jpg,ant,train"]
    server.upload(f"{scheme}://bkt/in/list.csv", ("path,label,split\n" + "\n".join(rows) + "\n").encode())
    flags = server.beam_flags if scheme == "s3" else []
    out = tmp_path / "ds"
    run(server, "beam_etl", "convert", "--input", f"{scheme}://bkt/in/list.csv", "--output", out, "--num_shards", "1",
        "--max_reject_fraction", "0.5", *flags)
    document = json.loads((out / "dataset.json").read_text())
    assert document["inputs"] == 4 and document["rejected"]["by_reason"] == {"unreadable": 1}
    assert local_summary(out)["rejects"] == [(f"{prefix}train/ant/deleted.jpg", "unreadable")]
    assert document["label_names"] == ["ant", "bee", "cow"]
    keys = {k for split in local_summary(out)["records"].values() for k in split}
    assert keys == {f"{prefix}train/ant/img_3.jpg", f"{prefix}validation/cow/img_14.jpg", "photos/train/bee/img_1.jpg"}


def test_gs_glob_gives_labels_from_parent_folders(gcs_server, gs_photos, tmp_path):
    prefix, _ = gs_photos
    run(gcs_server, "beam_etl", "convert", "--input", prefix + "train/*/*.png", "--output", tmp_path / "ds", "--num_shards", "1")
    document = json.loads((tmp_path / "ds" / "dataset.json").read_text())
    assert document["inputs"] == 3 and document["label_names"] == ["ant", "bee", "cow"]  # seeds 0, 4, 8


def _convert_fails(server, uri, tmp_path, *flags):
    proc = run(server, "beam_etl", "convert", "--input", uri, "--output", tmp_path / "ds", *flags, check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert not (tmp_path / "ds").exists() or not any((tmp_path / "ds").iterdir())  # stopped before any work
    return last_line(proc)


@pytest.mark.parametrize("scheme", ["gs", "s3"])
@pytest.mark.parametrize("path, says", [
    ("no-such-bucket-4711/photos/", "bucket {scheme}://no-such-bucket-4711 does not exist; check the name"),
    ("bkt/no/such/prefix/", "nothing under this prefix"),
    ("bkt/in/markers-only/", "only hidden files or folder markers under it (2); check the path"),
    ("bkt/in/no-images/", "no images under it: 2 files, none named as an image"),
    ("bkt/in/photos/*/*/nothing-*.png", "no files match it"),
])
def test_bad_bucket_input_is_one_line(request, scheme, path, says, tmp_path):
    server = request.getfixturevalue({"gs": "gcs_server", "s3": "s3_server"}[scheme])
    request.getfixturevalue(f"{scheme}_photos")
    for name, data in {"markers-only/": b"", "markers-only/ant/": b"", "no-images/labels.txt": b"ant\nbee\n",
                       "no-images/meta/info.json": b"{}"}.items():
        server.upload(f"{scheme}://bkt/in/{name}", data)
    uri = f"{scheme}://{path}"
    line = _convert_fails(server, uri, tmp_path, *(server.beam_flags if scheme == "s3" else []))
    assert line.startswith(f"beam-etl: error: --input {uri}: ") and says.format(scheme=scheme) in line, line


@pytest.fixture(scope="module")
def locked_s3(tmp_path_factory):
    """A second moto server that checks credentials: it knows none, so every request is denied."""
    from tests.objstore_servers import S3Server

    server = S3Server(str(tmp_path_factory.mktemp("s3_locked")), enforce_auth=True)
    yield server
    server.close()


def test_s3_access_denied_is_one_line(locked_s3, objstore_photos, tmp_path):
    line = _convert_fails(locked_s3, "s3://bkt/photos/", tmp_path, *locked_s3.beam_flags)
    assert line.startswith("beam-etl: error: --input s3://bkt/photos/: no access to s3://bkt (")
    assert "check your credentials" in line and "--s3_access_key_id" in line


def test_gs_access_denied_is_one_line():
    """The emulator has no access control; this is the error Beam's gcsio raises on a 403."""
    from apache_beam.io.filesystem import BeamIOError
    from google.api_core.exceptions import Forbidden

    from beam_etl import objstore

    denied = Forbidden("GET https://storage.googleapis.com/storage/v1/b/priv/o: anonymous caller does not "
                       "have storage.objects.list access to the Google Cloud Storage bucket.")
    with pytest.raises(objstore.StorageError) as raised:
        with objstore.explained("gs://priv/photos/"):
            raise BeamIOError("Match operation failed", {"gs://priv/photos/**": denied})
    message = str(raised.value)
    assert message.startswith("--input gs://priv/photos/: no access to gs://priv (") and "\n" not in message
    assert "gcloud auth application-default login" in message


TRIPWIRE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tripwire")


def _tripwire_env(tmp_path) -> dict:
    """No application-default credentials anywhere google.auth looks, no metadata server, and
    tests/tripwire/sitecustomize.py in every Python process, logging calls into Beam's retry loop."""
    home = tmp_path / "home"
    home.mkdir()
    return {"HOME": str(home), "CLOUDSDK_CONFIG": str(home / "gcloud"), "GOOGLE_APPLICATION_CREDENTIALS": "",
            "NO_GCE_CHECK": "true", "PYTHONPATH": TRIPWIRE + os.pathsep + ROOT,
            "BEAM_ETL_TRIPWIRE_LOG": str(tmp_path / "tripwire.log")}


def _tripwire_log(tmp_path) -> dict:
    lines = (tmp_path / "tripwire.log").read_text().split() if (tmp_path / "tripwire.log").exists() else []
    return {"armed": lines[0::2].count("armed"), "entered": lines[0::2].count("entered")}


def test_gs_run_without_credentials_skips_the_retry_loop(gcs_server, gs_photos, tmp_path):
    """The code path, in every process of a real run (launcher and encode pool): never entered."""
    prefix, _ = gs_photos
    run(gcs_server, "beam_etl", "convert", "--input", prefix + "validation/", "--output", tmp_path / "ds",
        "--num_shards", "1", "--max_reject_fraction", "0.5", "--encode_processes", "2", extra_env=_tripwire_env(tmp_path))
    log = _tripwire_log(tmp_path)
    assert log["armed"] >= 2, log  # the launcher and at least one encode process imported Beam's auth
    assert log["entered"] == 0, log


ANONYMOUS = """
from apache_beam.internal.gcp import auth
from apache_beam.options.pipeline_options import PipelineOptions
from beam_etl import objstore
objstore.configure([], ["gs://public-bucket/images/"])
assert auth._Credentials._credentials_init and auth.get_service_credentials(PipelineOptions()) is None
"""


def test_anonymous_bucket_without_emulator_skips_the_retry_loop(tmp_path):
    """A public bucket and no credentials: the launcher decides 'anonymous' once; Beam never retries.

    Also the guard for the one private attribute this relies on: if a Beam upgrade renames
    _Credentials' cache, configure() can't fill it, Beam looks up credentials itself, and the
    tripwire sees the retry loop entered.
    """
    proc = run(None, "-c", ANONYMOUS, extra_env=dict(_tripwire_env(tmp_path), STORAGE_EMULATOR_HOST=""))
    assert _tripwire_log(tmp_path) == {"armed": 1, "entered": 0}
    assert "reading gs:// anonymously" in proc.stderr


def test_beam_still_has_the_credential_cache():
    """objstore._gcs_credentials fills this private cache; a Beam upgrade that drops it must fail here."""
    from apache_beam.internal.gcp import auth

    for name in ("_credentials_lock", "_credentials_init", "_credentials", "_get_credentials_with_retrys"):
        assert hasattr(auth._Credentials, name), f"Beam {sys.modules['apache_beam'].__version__} has no _Credentials.{name}"
