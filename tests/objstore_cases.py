"""What the object-storage tests share: a photo tree with hard cases, commands run as a user runs
them (each in its own process, with a server's environment), and a dataset's records read back."""

import json
import os
import subprocess
import sys

from tests.conftest import ROOT
from tests.corpus import jpeg, make_folder

FLAGS = ["--num_shards", "train=2,validation=1", "--max_reject_fraction", "0.5"]

# Bad files: each must end as a reject with the same reason wherever it was read from.
BROKEN = {"train/ant/truncated.jpg": b"\xff\xd8\xff\xe0 not much more", "validation/bee/empty.jpg": b""}
# Keys that object stores and URL encoding get wrong: spaces, non-ASCII, '+', '%', '&', '=', no
# extension, depth. ('#' is left out: gcp-storage-emulator puts it unescaped in the mediaLink that
# google-cloud-storage downloads from, so the read 404s there; real GCS escapes it.)
AWKWARD = {
    "train/cow/deep/er/img space ü+1.jpg": 40,
    "train/bee/50%off (2)&x=1.jpg": 41,
    "validation/ant/no_extension": 42,
}
# Not inputs, on disk and in buckets alike.
HIDDEN = {"train/.DS_Store": b"\x00\x00\x00\x01Bud1", "validation/cow/.hidden.jpg": b"not read"}
# Zero-byte "folder/" objects that consoles and sync tools create; they exist only in buckets.
MARKERS = ("", "train/", "train/ant/", "validation/")

INPUTS = 12 + 6 + len(BROKEN) + len(AWKWARD)  # what dataset.json counts as inputs

# key -> sha256 per split, read back through TensorFlow's own reader (gs:// through its client).
READ_RECORDS = r"""
import json, sys
import tensorflow as tf
data_dir = sys.argv[1]
with tf.io.gfile.GFile(data_dir + "/dataset.json") as f:
    doc = json.load(f)
names = {role: f["name"] for role, f in doc["features"].items()}
spec = {names[r]: tf.io.FixedLenFeature([], tf.string) for r in ("key", "sha256")}
out = {}
for split, info in doc["splits"].items():
    files = [data_dir + "/" + s["file"] for s in info["shards"]]
    for raw in tf.data.TFRecordDataset(files, compression_type=doc["tfrecord_compression"]):
        rec = tf.io.parse_single_example(raw, spec)
        out.setdefault(split, {})[rec[names["key"]].numpy().decode()] = rec[names["sha256"]].numpy().decode()
print(json.dumps(out))
"""


def make_photos(root) -> dict:
    """Folder-layout splits, ROOT/<split>/<label>/..., with bad, awkward and hidden files."""
    files = make_folder(root / "train", seeds=range(12))
    files.update(make_folder(root / "validation", seeds=range(12, 18)))
    extra = dict(BROKEN, **HIDDEN, **{rel: jpeg(50 + seed, 40, seed=seed) for rel, seed in AWKWARD.items()})
    for rel, data in extra.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files


def upload_photos(server, root, prefix: str) -> None:
    """The tree under `prefix`, plus the folder markers a bucket may hold."""
    server.upload_tree(root, prefix)
    for marker in MARKERS:
        server.upload(f"{prefix.rstrip('/')}/{marker}", b"")


def env(server=None) -> dict:
    return dict(os.environ, **(server.env if server else {}), PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")


def run(server, *args, check=True, timeout=900, extra_env=None):
    """One command (`beam_etl ...`, `trainer ...` or `-c CODE`) as its own process."""
    cmd = [sys.executable, *(args if args[0] == "-c" else ["-m", *args])]
    proc = subprocess.run([str(a) for a in cmd], capture_output=True, text=True, env=dict(env(server), **(extra_env or {})),
                          cwd=ROOT, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{args[:2]} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return proc


def records(server, data_dir) -> dict:
    """{split: {key: sha256 of the stored image bytes}}."""
    return json.loads(run(server, "-c", READ_RECORDS, data_dir).stdout)


def local_summary(data_dir) -> dict:
    """What must be equal between conversions of the same files: records, labels and rejects."""
    document = json.loads((data_dir / "dataset.json").read_text())
    rejects = sorted((row["key"], row["reason"]) for row in map(json.loads, (data_dir / "rejected.jsonl").read_text().splitlines()))
    return {
        "records": records(None, data_dir),
        "label_names": document["label_names"],
        "inputs": document["inputs"],
        "rejected": document["rejected"],
        "rejects": rejects,
    }


def last_line(proc) -> str:
    lines = proc.stderr.strip().splitlines()
    return lines[-1] if lines else ""
