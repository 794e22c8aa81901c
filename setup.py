"""One distribution, two packages: the Beam converter and the trainer. Also Beam's --setup_file."""

import setuptools

# Tested together on Python 3.11; constraints.txt pins the whole resolved set.
REQUIRED = [
    "apache-beam==2.77.0",
    "tensorflow==2.21.0",
    "tensorflow-transform==1.21.0",
    "tfx-bsl==1.21.0",
    "pillow==12.3.0",
    "numpy==2.4.6",
    "google-crc32c>=1.5",
]

setuptools.setup(
    name="beam-image-etl",
    version="0.1.0",
    description="Convert millions of images into sharded TFRecords with Apache Beam, and train on them with tf.data.",
    python_requires=">=3.11,<3.12",
    packages=setuptools.find_packages(include=["beam_etl", "beam_etl.*", "trainer", "trainer.*"]),
    install_requires=REQUIRED,
    extras_require={
        "gcp": ["apache-beam[gcp]==2.77.0"],
        "aws": ["apache-beam[aws]==2.77.0"],
        "dask": ["apache-beam[dask]==2.77.0"],
        "dev": ["pytest==9.2.0", "mlxtend==0.25.0"],
    },
    entry_points={"console_scripts": ["beam-etl=beam_etl.cli:run", "trainer=trainer.cli:main"]},
)
