# syntax=docker/dockerfile:1
# One Dockerfile, one target per image:
#   docker build --target trainer -t beam-image-etl-trainer:0.1.0 .
#   docker build --target etl     -t beam-image-etl-etl:0.1.0 .
# Every base is pinned to the version the package pins (setup.py, constraints.txt).
# Build tools live only in the `wheel` stage; the final stages get the built wheel and pip.
# Validated offline by tests/test_templates.py with hadolint (no Docker engine there).

ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm
ARG TENSORFLOW_IMAGE=tensorflow/tensorflow:2.21.0-gpu
ARG BEAM_SDK_IMAGE=apache/beam_python3.11_sdk:2.77.0
# The Dataflow Flex Template launcher binary; see README "Running at scale" for how to pick the tag.
ARG FLEX_LAUNCHER_IMAGE=gcr.io/dataflow-templates-base/python311-template-launcher-base:flex_templates_base_image_release_20251110_RC00

# ---- wheel: builds dist/beam_image_etl-*.whl; nothing of this stage but the wheel is kept.
FROM ${PYTHON_IMAGE} AS wheel
WORKDIR /src
COPY setup.py constraints.txt ./
COPY beam_etl/ beam_etl/
COPY trainer/ trainer/
RUN python -m pip wheel --no-cache-dir --no-deps --wheel-dir /dist . \
 && cp constraints.txt /dist/constraints.txt

# ---- trainer: `docker run --gpus all --shm-size=16g IMAGE train --data_dir ... --job_dir ...`
FROM ${TENSORFLOW_IMAGE} AS trainer
ARG UID=1000
# The wheel needs the image's Python to be the one the package is tested on.
RUN python3 -c "import sys; assert sys.version_info[:2] == (3, 11), sys.version"
COPY --from=wheel /dist/ /tmp/dist/
# The same install step as tests/test_packaging.py: the wheel, with the pinned set as constraints.
RUN python3 -m pip install --no-cache-dir -c /tmp/dist/constraints.txt /tmp/dist/beam_image_etl-0.1.0-py3-none-any.whl \
 && rm -rf /tmp/dist \
 && useradd --create-home --uid "${UID}" --shell /usr/sbin/nologin trainer
USER ${UID}
WORKDIR /home/trainer
ENV TF_CPP_MIN_LOG_LEVEL=2
ENTRYPOINT ["trainer"]
CMD ["--help"]

# ---- launcher: only a source of the Flex Template launcher binary.
FROM ${FLEX_LAUNCHER_IMAGE} AS launcher

# ---- etl: the Dataflow Flex Template launcher AND the custom SDK worker image
# (--sdk_container_image), and the Python SDK worker pool for Flink
# (command: python -m apache_beam.runners.worker.worker_pool_main --service_port=50000).
FROM ${BEAM_SDK_IMAGE} AS etl
ARG UID=1000
COPY --from=launcher /opt/google/dataflow/python_template_launcher /opt/google/dataflow/python_template_launcher
COPY --from=wheel /dist/ /tmp/dist/
RUN python -m pip install --no-cache-dir -c /tmp/dist/constraints.txt "/tmp/dist/beam_image_etl-0.1.0-py3-none-any.whl[gcp,aws]" \
 && rm -rf /tmp/dist \
 && useradd --create-home --uid "${UID}" --shell /usr/sbin/nologin beam
COPY templates/dataflow/main.py /template/main.py
# The launcher runs this file with the template's parameters; the package is already installed,
# so no FLEX_TEMPLATE_PYTHON_SETUP_FILE or requirements file is needed.
ENV FLEX_TEMPLATE_PYTHON_PY_FILE=/template/main.py
USER ${UID}
WORKDIR /home/beam
# The Beam SDK harness: what Dataflow workers and the Flink worker pool run.
ENTRYPOINT ["/opt/apache/beam/boot"]
