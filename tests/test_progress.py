"""Progress while `convert` runs: the side channel from the encoder, the lines, the job address on remote runners."""

import json
import re

from beam_etl import progress, sources
from tests.conftest import run_convert
from tests.test_convert_e2e import BROKEN, make_folder

LINE = re.compile(r"^beam-etl: progress: (\d+)/(\d+|\?) images")


def test_tallies_add_up_across_workers(tmp_path):
    folder = tmp_path / "progress"
    assert progress.read_counts(str(folder)) == (0, 0)  # before any worker has written
    first, second = progress.Tally(str(folder)), progress.Tally(str(folder))
    for _ in range(5):
        first.add(encoded=1)
    second.add(rejected=1)
    second.add(encoded=1)
    first.flush()
    second.flush()
    (folder / "half-written.json.tmp").write_text('{"encoded": 10')  # a rewrite in flight is not read
    assert progress.read_counts(str(folder)) == (6, 1)
    progress.tally(None).add(encoded=1)  # progress off: nothing written anywhere
    assert sorted(p.name for p in folder.iterdir() if p.suffix == ".json") == sorted([first.path.split("/")[-1], second.path.split("/")[-1]])


def test_rate_eta_and_lines():
    rate = progress.Rate()
    assert rate.update(10.0, 0) is None and rate.update(11.0, 100) is None  # start-up, then the first images
    assert rate.update(13.0, 500) == 200.0
    assert rate.update(20.0, 500) == 200.0  # no more images done: the encoding rate holds
    s = progress.status(done=500, rejected=7, total=1500, rate=200.0, elapsed=75)
    assert s["eta"] == 5.0
    assert progress.log_line(s) == "500/1500 images (33%), 200 images/s, 7 rejected, ETA 0:05 [1:15 elapsed]"
    assert progress.bar_line(s, width=10).startswith("[###.......] 500/1500")
    assert "ETA ?" in progress.log_line(progress.status(3, 0, None, None, 1)) and "3/? images" in progress.log_line(progress.status(3, 0, None, None, 1))
    assert progress.log_line(progress.status(1500, 7, 1500, 200.0, 3700)).endswith("encoding done; writing shards and statistics [1:01:40 elapsed]")
    assert progress.log_line(progress.status(1500, 7, 1500, 200.0, 80), final=True) == "done: 1500 images, 7 rejected, 200 images/s while encoding, 1:20 from the start of the job"


def test_count_matches_the_pipeline_listing(tmp_path):
    root = tmp_path / "src"
    make_folder(root, extra=BROKEN)
    (root / ".DS_Store").write_bytes(b"x")
    (root / "ant" / ".hidden.jpg").write_bytes(b"x")
    manifest = tmp_path / "m.csv"
    manifest.write_text("path,label\nsrc/ant/img_0.png,ant\nsrc/bee/img_1.jpg,bee\n")
    listed = sum(1 for _ in sources.list_source(sources.classify(str(root))))
    assert listed == 16
    assert progress.count_inputs([str(root), str(manifest)]) == 18


def test_mode_auto_and_none(tmp_path):
    class Pipe:  # a pipe, as when the output is redirected: not a terminal
        def isatty(self):
            return False

    assert progress.resolve_mode("auto", Pipe()) == "log" and progress.resolve_mode("bar", Pipe()) == "bar"
    with progress.Reporter("none", str(tmp_path), [str(tmp_path)], 0.01) as reporter:
        assert reporter.thread is None


def test_remote_runner_logs_the_job_and_where_to_watch_it():
    from apache_beam.options.pipeline_options import PipelineOptions

    class Submitted:  # what DataflowRunner's run() returns, reduced to the one method used
        def job_id(self):
            return "2026-01-01_00_00_00-123"

    lines = progress.watch_lines(Submitted(), PipelineOptions(["--runner", "DataflowRunner", "--project", "proj", "--region", "europe-west4"]))
    assert lines == [
        "beam-etl: submitted to DataflowRunner as job 2026-01-01_00_00_00-123",
        "beam-etl: watch it at https://console.cloud.google.com/dataflow/jobs/europe-west4/2026-01-01_00_00_00-123?project=proj",
    ]
    assert "Flink web UI at http://jm:8081" in progress.watch_lines(Submitted(), PipelineOptions(["--runner", "FlinkRunner", "--flink_master", "jm:8081"]))[1]
    assert progress.is_direct(PipelineOptions([])) and not progress.is_direct(PipelineOptions(["--runner", "DataflowRunner"]))


def test_convert_logs_progress_and_a_final_line(tmp_path):
    root = tmp_path / "src"
    make_folder(root, extra=BROKEN)
    proc = run_convert("--input", root, "--output", tmp_path / "ds", "--max_reject_fraction", "0.5", "--progress", "log", "--progress_interval", "0.2")
    lines = [line for line in proc.stderr.splitlines() if line.startswith("beam-etl: progress:")]
    assert lines[-1].startswith("beam-etl: progress: done: 16 images, 4 rejected")
    done = [int(m.group(1)) for m in map(LINE.match, lines[:-1]) if m]
    assert done == sorted(done) and all(d <= 16 for d in done)  # counts only grow, never past the inputs
    assert all(m.group(2) in ("16", "?") for m in map(LINE.match, lines[:-1]) if m)


def test_encoder_writes_live_counts_into_staging(tmp_path):
    root = tmp_path / "src"
    make_folder(root, seeds=range(3), extra=BROKEN)
    out = tmp_path / "ds"
    proc = run_convert("--input", root, "--output", out, "--progress", "log", check=False)
    assert proc.returncode == 1 and "were rejected" in proc.stderr  # the run stops before publishing
    (staging,) = [p for p in out.iterdir() if p.name.startswith(".staging-")]
    tallies = [json.loads(p.read_text()) for p in (staging / "progress").glob("*.json")]
    assert tallies and sum(t["encoded"] for t in tallies) == 3 and sum(t["rejected"] for t in tallies) == 4
