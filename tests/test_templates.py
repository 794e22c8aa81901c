"""The deployment files, validated offline with the tools the [dev] extra installs.

Dockerfile: hadolint. Kubernetes manifests: kubernetes-validate --strict against the bundled
1.30 schemas. The Dataflow Flex Template metadata: check-jsonschema against the schema kept in
templates/schemas/, that schema checked against the Dataflow API's own messages, and the
parameters checked against the real `convert` argparse parser. Workflows: actionlint.
All YAML: yamllint --strict. Each validator also gets one bad file, to show it is really on.
"""

import argparse
import dataclasses
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import yaml

from tests.conftest import ROOT

TEMPLATES = os.path.join(ROOT, "templates")
METADATA = os.path.join(TEMPLATES, "dataflow", "metadata.json")
SCHEMA = os.path.join(TEMPLATES, "schemas", "flex-template-metadata.schema.json")
K8S_MANIFESTS = sorted(
    os.path.join(TEMPLATES, folder, name) for folder in ("k8s", "flink") for name in os.listdir(os.path.join(TEMPLATES, folder)) if name.endswith(".yaml")
)
WORKFLOWS = sorted(os.path.join(ROOT, ".github", "workflows", n) for n in os.listdir(os.path.join(ROOT, ".github", "workflows")))
KUBERNETES_VERSION = "1.30.0"
# Beam options the template also takes (all other parameters are `convert` flags).
BEAM_PARAMETERS = {"sdk_container_image", "sdk_location"}


def tool(name):
    """The validator's executable, from the same environment as this Python."""
    path = os.path.join(os.path.dirname(sys.executable), name)
    path = path if os.path.exists(path) else shutil.which(name)
    if not path:
        pytest.fail(f"{name} is not installed: pip install -c constraints.txt -e '.[dev]'")
    return path


def run(*args):
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, cwd=ROOT, timeout=300)


def load_yaml(path):
    with open(path) as f:
        return [doc for doc in yaml.safe_load_all(f) if doc]


def convert_actions():
    """The options of the real `beam-etl convert` parser."""
    from beam_etl import cli

    parser = cli._convert_parser(argparse.ArgumentParser().add_subparsers())
    return [a for a in parser._actions if a.option_strings and a.dest != "help"]


# ---- Dockerfile


def test_dockerfile_passes_hadolint():
    proc = run(tool("hadolint"), "--failure-threshold", "style", "Dockerfile")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hadolint_rejects_a_bad_dockerfile(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu:latest\nRUN apt-get update && apt-get install -y gcc\nRUN pip install requests\n")
    proc = run(tool("hadolint"), "--failure-threshold", "style", bad)
    assert proc.returncode == 1 and "DL3007" in proc.stdout and "DL3013" in proc.stdout


def _stages():
    """Dockerfile stages: name -> (base, [instruction lines]), with ARG defaults substituted."""
    text = open(os.path.join(ROOT, "Dockerfile")).read().replace("\\\n", " ")
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", text, re.M))
    stages, current = {}, None
    for line in text.splitlines():
        line = line.strip()
        m = re.match(r"FROM (\S+) AS (\S+)", line)
        if m:
            base = re.sub(r"\$\{(\w+)\}", lambda v: args[v.group(1)], m.group(1))
            current = stages.setdefault(m.group(2), (base, []))
        elif current and line and not line.startswith("#"):
            current[1].append(line)
    return stages


def _pins():
    from importlib.metadata import version

    return {name: version(name) for name in ("tensorflow", "apache-beam")}


def test_dockerfile_targets_pin_the_tested_versions():
    stages = _stages()
    pins = _pins()
    assert {"trainer", "etl"} <= set(stages)
    assert stages["trainer"][0] == f"tensorflow/tensorflow:{pins['tensorflow']}-gpu"
    assert stages["etl"][0] == f"apache/beam_python3.11_sdk:{pins['apache-beam']}"
    for name, (base, _) in stages.items():
        assert re.search(r":(?!latest$)[\w.\-]*[0-9][\w.\-]*$", base), f"stage {name}: base {base} has no pinned version tag"


@pytest.mark.parametrize("target", ["trainer", "etl"])
def test_final_stages_run_as_non_root_without_build_tools(target):
    _, lines = _stages()[target]
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users and users[-1] not in ("root", "0"), f"{target} must end as a non-root user"
    installs = " ".join(line for line in lines if line.startswith("RUN "))
    assert not re.search(r"apt-get install|\bgcc\b|build-essential|pip install[^&]*\bbuild\b", installs)
    assert "constraints.txt" in installs and ".whl" in installs  # the wheel, with the pinned set


def test_trainer_entrypoint_is_the_console_script():
    _, lines = _stages()["trainer"]
    assert 'ENTRYPOINT ["trainer"]' in lines


def test_etl_image_is_both_flex_launcher_and_sdk_worker():
    _, lines = _stages()["etl"]
    text = "\n".join(lines)
    assert "/opt/google/dataflow/python_template_launcher" in text
    assert "FLEX_TEMPLATE_PYTHON_PY_FILE=/template/main.py" in text
    assert 'ENTRYPOINT ["/opt/apache/beam/boot"]' in lines


# ---- Dataflow Flex Template


def test_flex_template_metadata_matches_the_schema():
    proc = run(tool("check-jsonschema"), "--schemafile", SCHEMA, METADATA)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = run(tool("check-jsonschema"), "--check-metaschema", SCHEMA)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_schema_rejects_a_bad_metadata_file(tmp_path):
    document = json.load(open(METADATA))
    document["parameters"][0]["paramType"] = "FOLDER"  # no such ParameterType
    document["parameters"][1]["helptext"] = "typo"  # no such field
    bad = tmp_path / "metadata.json"
    bad.write_text(json.dumps(document))
    proc = run(tool("check-jsonschema"), "--schemafile", SCHEMA, bad)
    assert proc.returncode == 1 and "FOLDER" in proc.stdout + proc.stderr


def _camel(name):
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def test_schema_is_the_dataflow_api_message():
    """The schema's fields are those of google.dataflow.v1beta3 TemplateMetadata/ParameterMetadata."""
    from google.cloud.dataflow_v1beta3.types import templates

    schema = json.load(open(SCHEMA))
    assert set(schema["properties"]) == {_camel(f) for f in templates.TemplateMetadata.meta.fields}
    parameter = schema["$defs"]["parameter"]
    assert set(parameter["properties"]) == {_camel(f) for f in templates.ParameterMetadata.meta.fields}
    assert parameter["properties"]["paramType"]["enum"] == [t.name for t in templates.ParameterType]
    assert set(schema["$defs"]["enumOption"]["properties"]) == {_camel(f) for f in templates.ParameterMetadataEnumOption.meta.fields}
    # And the Dataflow client parses the metadata file itself, rejecting unknown fields.
    templates.TemplateMetadata.from_json(open(METADATA).read(), ignore_unknown_fields=False)


def test_flex_template_has_every_convert_flag():
    parameters = {p["name"]: p for p in json.load(open(METADATA))["parameters"]}
    actions = convert_actions()
    flags = {a.option_strings[0][2:]: a for a in actions}
    assert all(len(a.option_strings) == 1 for a in actions)
    assert set(parameters) - BEAM_PARAMETERS == set(flags), "metadata.json and `convert` disagree on the flags"
    for name, action in flags.items():
        p = parameters[name]
        assert p["isOptional"] is (not action.required), name
        if isinstance(action, argparse._StoreTrueAction):
            assert p["paramType"] == "BOOLEAN" and p["defaultValue"] == "false", name
        elif action.choices:
            assert p["paramType"] == "ENUM", name
            assert [o["value"] for o in p["enumOptions"]] == [str(c) for c in action.choices], name
        if "defaultValue" in p and not isinstance(action, argparse._StoreTrueAction):
            assert p["defaultValue"] == str(action.default), name
        for regex in p.get("regexes", []):
            if "defaultValue" in p:
                assert re.fullmatch(regex, p["defaultValue"]), (name, regex)


def test_beam_parameters_are_real_beam_options():
    from apache_beam.options.pipeline_options import PipelineOptions

    options = PipelineOptions([f"--{name}=x" for name in sorted(BEAM_PARAMETERS)]).get_all_options(retain_unknown_options=False)
    assert all(options.get(name) == "x" for name in BEAM_PARAMETERS)


def _flex_main():
    spec = importlib.util.spec_from_file_location("flex_main", os.path.join(TEMPLATES, "dataflow", "main.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _sample(p):
    if "defaultValue" in p:
        return p["defaultValue"]
    return {"input": "gs://b/images", "output": "gs://b/datasets/v1", "labels": "ant,bee", "num_shards": "train=4,validation=1"}.get(p["name"], "container")


def test_flex_launcher_main_turns_every_parameter_into_convert_arguments():
    """As the launcher passes them (--name=value), every parameter parses with the real CLI."""
    from beam_etl import cli

    main = _flex_main()
    parameters = json.load(open(METADATA))["parameters"]
    argv = [f"--{p['name']}={_sample(p)}" for p in parameters] + ["--runner=DataflowRunner", "--project=p", "--region=r"]
    argv = [a.replace("--overwrite=false", "--overwrite=true") for a in argv]
    converted = main.template_args(argv)
    parser = argparse.ArgumentParser()
    cli._convert_parser(parser.add_subparsers(dest="command"))
    args, beam_args = parser.parse_known_args(converted)
    assert args.command == "convert" and args.input == ["gs://b/images"] and args.overwrite is True and args.write_index is False
    assert sorted(beam_args) == sorted(["--runner=DataflowRunner", "--project=p", "--region=r"] + [f"--{n}={_sample({'name': n})}" for n in BEAM_PARAMETERS])
    with pytest.raises(SystemExit):
        main.template_args(["--overwrite=maybe"])


def test_dataflow_job_is_built_without_credentials(tmp_path):
    """`convert` with Dataflow options, through DataflowRunner's translation, stopped before submission.

    --dry_run (Beam's TestOptions) makes DataflowRunner build the whole Dataflow job (overrides,
    the portable proto, the job request) and return without calling the service; --no_auth
    skips credentials. Beam's validator rejects `--project p` (not a project id) and
    `gs://b/tmp` (not a bucket name: it then tries to create a default bucket over the
    network), so real-looking names are used. The output is local: tf.Transform creates
    its temp folder under --output while the graph is built, which on gs:// needs GCS.
    """
    import apache_beam as beam
    from apache_beam.options.pipeline_options import GoogleCloudOptions, StandardOptions

    from beam_etl import cli, pipeline

    (tmp_path / "images" / "ant").mkdir(parents=True)
    (tmp_path / "images" / "ant" / "a.jpg").write_bytes(b"x")
    argv = [
        "convert", "--input", str(tmp_path / "images"), "--output", str(tmp_path / "out"), "--num_shards", "train=4,validation=1", "--validation_fraction", "0.1",
        "--runner=DataflowRunner", "--project", "beam-etl-test", "--region", "us-central1", "--temp_location", "gs://beam-etl-test/tmp",
        "--sdk_location=container", "--sdk_container_image=REGISTRY/beam-image-etl-etl:0.1.0", "--job_name=beam-etl-dry-run",
        "--dry_run=True", "--no_auth",
    ]
    parser = argparse.ArgumentParser()
    cli._convert_parser(parser.add_subparsers(dest="command"))
    args, beam_args = parser.parse_known_args(argv)
    config = dataclasses.replace(cli._config(args, beam_args), encode_processes=4)  # asked for: still no pool-style fusion on Dataflow
    options = cli._pipeline_options(beam_args)
    gcp = options.view_as(GoogleCloudOptions)
    assert (gcp.project, gcp.region, gcp.temp_location) == ("beam-etl-test", "us-central1", "gs://beam-etl-test/tmp")
    assert options.view_as(StandardOptions).runner == "DataflowRunner" and config.writer == "staged"
    p = beam.Pipeline(options=options)
    pipeline.build(p, config)
    job = p.run().job  # DataflowRunner's apiclient.Job, not submitted
    assert job.proto.name == "beam-etl-dry-run"
    environments = list(job.proto_pipeline.components.environments.values())
    assert environments and all(b"REGISTRY/beam-image-etl-etl:0.1.0" in e.payload for e in environments)
    names = [t.unique_name for t in job.proto_pipeline.components.transforms.values()]
    assert any(n.startswith("Publish") for n in names) and any(n.startswith("WriteShards/Stage") for n in names)
    assert any(n.startswith("ListImages/BreakFusion") for n in names)  # reading spreads over Dataflow's workers


# ---- Kubernetes


def test_kubernetes_manifests_validate_strictly():
    assert K8S_MANIFESTS
    proc = run(tool("kubernetes-validate"), "--strict", "-k", KUBERNETES_VERSION, "--quiet", *K8S_MANIFESTS)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_kubernetes_validate_rejects_an_unknown_field(tmp_path):
    job = load_yaml(os.path.join(TEMPLATES, "k8s", "trainer-job.yaml"))[0]
    job["spec"]["template"]["spec"]["containers"][0]["gpus"] = 1  # not a Container field
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(job))
    proc = run(tool("kubernetes-validate"), "--strict", "-k", KUBERNETES_VERSION, bad)
    assert proc.returncode != 0 and "gpus" in proc.stdout + proc.stderr


def _pod(path, kind="Job", name=None):
    for doc in load_yaml(path):
        if doc["kind"] == kind and (name is None or doc["metadata"]["name"] == name):
            return doc["spec"]["template"]["spec"]
    raise AssertionError(f"no {kind} {name or ''} in {path}")


def _flags(container):
    return dict(a.split("=", 1) for a in container.get("args", []) if a.startswith("--") and "=" in a)


def _check_trainer_pod(pod):
    (trainer,) = [c for c in pod["containers"] if c["name"] == "trainer"]
    assert int(trainer["resources"]["limits"]["nvidia.com/gpu"]) >= 1
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in trainer["volumeMounts"]}
    shm = volumes[mounts["/dev/shm"]["name"]]
    assert shm["emptyDir"]["medium"] == "Memory" and shm["emptyDir"].get("sizeLimit")
    flags = _flags(trainer)

    def volume_of(path):
        mount = max((m for m in mounts if path.startswith(m.rstrip("/") + "/")), key=len)
        return mounts[mount], volumes[mounts[mount]["name"]]

    data_mount, data_volume = volume_of(flags["--data_dir"])
    assert data_mount.get("readOnly") and "persistentVolumeClaim" in data_volume
    job_mount, job_volume = volume_of(flags["--job_dir"])  # BackupAndRestore writes JOB_DIR/backup
    assert not job_mount.get("readOnly") and "persistentVolumeClaim" in job_volume
    assert pod["securityContext"]["runAsNonRoot"] is True
    return flags


def test_trainer_job_has_gpu_shm_data_and_backup_volume():
    _check_trainer_pod(_pod(os.path.join(TEMPLATES, "k8s", "trainer-job.yaml")))


def test_etl_then_train_waits_for_the_datasets_dataset_json():
    path = os.path.join(TEMPLATES, "k8s", "etl-then-train.yaml")
    etl = _pod(path, name="etl-run-REPLACE")["containers"][0]
    trainer_pod = _pod(path, name="trainer-run-REPLACE")
    flags = _check_trainer_pod(trainer_pod)
    output = _flags(etl)["--output"]
    assert etl["command"] == ["beam-etl"] and etl["args"][0] == "convert"
    assert flags["--data_dir"] == output
    (wait,) = trainer_pod["initContainers"]
    env = {e["name"]: e["value"] for e in wait["env"]}
    assert env["DATA_DIR"] == output and "dataset.json" in wait["args"][0]


def test_flink_manifests_wire_job_server_worker_pool_and_launcher():
    flink = os.path.join(TEMPLATES, "flink")
    services = {d["metadata"]["name"]: d for f in ("flink-session-cluster.yaml", "beam-job-server.yaml") for d in load_yaml(os.path.join(flink, f)) if d["kind"] == "Service"}
    job_server = _pod(os.path.join(flink, "beam-job-server.yaml"), kind="Deployment")["containers"][0]
    assert "--flink-master=flink-jobmanager:8081" in job_server["args"]
    assert 8081 in [p["port"] for p in services["flink-jobmanager"]["spec"]["ports"]]
    taskmanager = _pod(os.path.join(flink, "flink-session-cluster.yaml"), kind="Deployment")  # the first is the jobmanager
    pods = [d["spec"]["template"]["spec"] for d in load_yaml(os.path.join(flink, "flink-session-cluster.yaml")) if d["kind"] == "Deployment"]
    (taskmanager,) = [p for p in pods if any(c["name"] == "taskmanager" for c in p["containers"])]
    (pool,) = [c for c in taskmanager["containers"] if c["name"] == "beam-worker-pool"]
    assert pool["command"] == ["python", "-m", "beam_etl.sdk_pool"]
    (port,) = [int(a.split("=")[1]) for a in pool["args"] if a.startswith("--service_port=")]
    assert pool["ports"][0]["containerPort"] == pool["livenessProbe"]["tcpSocket"]["port"] == port
    launcher = _flags(_pod(os.path.join(flink, "convert-job.yaml"))["containers"][0])
    assert launcher["--environment_type"] == "EXTERNAL" and launcher["--environment_config"] == f"localhost:{port}"
    host, port = launcher["--job_endpoint"].split(":")
    assert int(port) in [p["port"] for p in services[host]["spec"]["ports"]]


def test_flink_templates_carry_what_the_local_cluster_proved():
    """The same Flink minor version as `beam-etl flink up`, and the settings its tests need."""
    import yaml

    from beam_etl import flink

    folder = os.path.join(TEMPLATES, "flink")
    docs = load_yaml(os.path.join(folder, "flink-session-cluster.yaml"))
    (config_map,) = [d for d in docs if d["kind"] == "ConfigMap"]
    config = yaml.safe_load(config_map["data"]["config.yaml"])
    minor = flink.FLINK_VERSION.rsplit(".", 1)[0]
    images = [c["image"] for d in docs if d["kind"] == "Deployment" for c in d["spec"]["template"]["spec"]["containers"]
              if c["image"].startswith("flink:")]
    assert len(images) == 2 and all(i.startswith(f"flink:{minor}.") for i in images), images
    job_server = _pod(os.path.join(folder, "beam-job-server.yaml"), kind="Deployment")["containers"][0]["image"]
    assert job_server.startswith(f"apache/beam_flink{minor}_job_server:"), job_server
    proven = [k for k in flink.CONFIG if k.startswith(("restart-strategy", "jobmanager.execution", "taskmanager.memory.network",
                                                        "taskmanager.network", "taskmanager.memory.task.off-heap"))]
    assert len(proven) == 8
    assert {k: str(config[k]) for k in proven} == {k: flink.CONFIG[k] for k in proven}
    launcher = _flags(_pod(os.path.join(folder, "convert-job.yaml"))["containers"][0])
    assert launcher["--flink_master"] == "flink-jobmanager:8081" and int(launcher["--parallelism"]) == config["parallelism.default"]
    assert int(launcher["--environment_expiration_millis"]) == flink.ENVIRONMENT_EXPIRATION_MS


def test_flink_launcher_flags_are_beam_options_and_the_graph_builds(tmp_path):
    """The launcher's flags as `convert` splits them: its own, and Beam's, which Beam parses."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import FlinkRunnerOptions, PipelineOptions, PortableOptions

    from beam_etl import cli, pipeline

    args = _pod(os.path.join(TEMPLATES, "flink", "convert-job.yaml"))["containers"][0]["args"]
    (tmp_path / "images" / "ant").mkdir(parents=True)
    (tmp_path / "images" / "ant" / "a.jpg").write_bytes(b"x")
    args = [a.replace("/data/", f"{tmp_path}/") for a in args]
    parser = argparse.ArgumentParser()
    cli._convert_parser(parser.add_subparsers(dest="command"))
    parsed, beam_args = parser.parse_known_args(args)
    options = PipelineOptions(beam_args)
    portable = options.view_as(PortableOptions)
    assert portable.environment_type == "EXTERNAL" and portable.job_endpoint == "beam-job-server:8099"
    assert options.view_as(FlinkRunnerOptions).parallelism == 8
    from beam_etl.runners import FlinkEnvironmentOptions  # Python lacks it: ours, so that it reaches Java

    assert options.view_as(FlinkEnvironmentOptions).environment_expiration_millis == 10_000
    config = cli._config(parsed, beam_args)
    assert config.writer == "staged"  # auto, on every runner, as cli._writer decides
    pipeline.build(beam.Pipeline(options=options), config)
    # The FlinkRunner form of README "Running at scale" parses too.
    flink = PipelineOptions(["--runner=FlinkRunner", "--flink_master=flink-jobmanager:8081", "--flink_submit_uber_jar", "--environment_type=EXTERNAL", "--environment_config=localhost:50000"])
    assert flink.view_as(FlinkRunnerOptions).flink_master == "flink-jobmanager:8081"


# ---- Workflows and YAML


def test_workflows_pass_actionlint():
    assert WORKFLOWS
    proc = run(tool("actionlint"), *WORKFLOWS)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_actionlint_rejects_a_bad_workflow(tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text("on: push\njobs:\n  a:\n    runs-on: ubuntu-24.04\n    steps:\n      - run: echo ${{ github.nope }}\n")
    proc = run(tool("actionlint"), bad)
    assert proc.returncode == 1 and "nope" in proc.stdout


def test_yaml_files_pass_yamllint():
    proc = run(tool("yamllint"), "--strict", "-c", os.path.join(ROOT, ".yamllint.yaml"), "templates", ".github", ".yamllint.yaml")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_rebuild_workflow_fingerprint_equals_the_pipelines(tmp_path):
    """The workflow's skip test compares `beam-etl fingerprint` with dataset.json's: the same value."""
    import apache_beam as beam
    from apache_beam.testing.util import assert_that, equal_to

    from beam_etl.transforms import ListImages

    for rel in ("ant/a.jpg", "ant/b.png", "bee/c.jpg", ".hidden/x.jpg"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(rel.encode() * 10)
    env = dict(os.environ, PYTHONPATH=ROOT)
    workflow = open(os.path.join(ROOT, ".github", "workflows", "rebuild-dataset.yml")).read()
    assert 'fingerprint=$(beam-etl fingerprint --input "$SOURCE_URI")' in workflow
    proc = subprocess.run([sys.executable, "-m", "beam_etl", "fingerprint", "--input", str(tmp_path)], capture_output=True, text=True, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    expected = proc.stdout.strip()
    assert re.fullmatch(r"[0-9a-f]{32}", expected)
    with beam.Pipeline() as p:
        _, fingerprint, _ = p | ListImages([str(tmp_path)])
        assert_that(fingerprint, equal_to([expected]))


# ---- The commands of "Running at scale"


def _shell_commands():
    """Each command line of the sh blocks, continuations joined, variables given sample values."""
    import shlex

    readme = open(os.path.join(ROOT, "README.md")).read()
    assert "## Running at scale" in readme
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", readme, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\$\(date [^)]*\)", "20260101-000000", line.split(" #")[0]).strip()
            line = re.sub(r"\$\w+", lambda m: {"$BUCKET": "my-bucket", "$REGISTRY": "registry.example/acme"}.get(m.group(0), "x"), line)
            if line and not line.startswith("#"):
                commands.append(shlex.split(line.rstrip("&").strip()))
    return commands


def test_running_at_scale_convert_commands_parse(caplog):
    """Every `beam-etl convert` command there: its flags parse, and Beam knows every other flag."""
    import logging

    import apache_beam.runners.dask.dask_runner  # noqa: F401 - registers DaskOptions, as --runner=... would
    from apache_beam.options.pipeline_options import PipelineOptions

    from beam_etl import cli

    parser = argparse.ArgumentParser()
    cli._convert_parser(parser.add_subparsers(dest="command"))
    converts = [c for c in _shell_commands() if c[:2] == ["beam-etl", "convert"]]
    assert len(converts) >= 4  # Dataflow, Flink (job server), FlinkRunner, Dask
    for command in converts:
        args, beam_args = parser.parse_known_args(command[1:])
        assert args.input and args.output and args.num_shards, command
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="apache_beam.options.pipeline_options"):
            PipelineOptions(beam_args).get_all_options()
        assert "Discarding unparseable args" not in caplog.text, (command, caplog.text)


def test_running_at_scale_trainer_commands_parse():
    from trainer import cli

    parser = argparse.ArgumentParser()
    cli._train_parser(parser.add_subparsers(dest="command"))
    runs = [c for c in _shell_commands() if c[:2] == ["docker", "run"] and "train" in c]
    assert len(runs) == 3
    for command in runs:
        image = next(i for i, token in enumerate(command) if "beam-image-etl-trainer" in token)
        args = parser.parse_args(command[image + 1 :])
        assert args.command == "train" and args.data_dir and args.job_dir
        assert "--shm-size" in " ".join(command) and "--gpus" in command


def test_running_at_scale_flex_template_run_names_only_template_parameters():
    names = {p["name"] for p in json.load(open(METADATA))["parameters"]}
    (run_cmd,) = [c for c in _shell_commands() if c[:4] == ["gcloud", "dataflow", "flex-template", "run"]]
    (value,) = [a.split("=", 1)[1] for a in run_cmd if a.startswith("--parameters=")]
    assert value.startswith("^~^")
    given = dict(item.split("=", 1) for item in value[3:].split("~"))
    assert set(given) <= names and {"input", "output"} <= set(given)
    (build,) = [c for c in _shell_commands() if c[:4] == ["gcloud", "dataflow", "flex-template", "build"]]
    assert "--metadata-file=templates/dataflow/metadata.json" in build and "--sdk-language=PYTHON" in build
