"""The hand-written Example encoder against TensorFlow's own parser."""

import pytest

from beam_etl import schema

tf = pytest.importorskip("tensorflow")

VALUES = {
    "image": b"\xff\xd8\x00binary\x00bytes",
    "label": 7,
    "label_text": "chat noir \u00e9\u00e8",
    "height": 480,
    "width": 2**40,
    "channels": 3,
    "format": "jpeg",
    "key": "cats/\u00fcber cat.jpg",
    "sha256": "ab" * 32,
}


def parse(serialized: bytes, schema_name: str) -> dict:
    features = schema.feature_spec_json(schema_name)
    spec = {f["name"]: tf.io.FixedLenFeature([], tf.string if f["dtype"] == "string" else tf.int64) for f in features.values()}
    parsed = tf.io.parse_single_example(serialized, spec)
    return {role: parsed[f["name"]].numpy() for role, f in features.items()}


@pytest.mark.parametrize("schema_name", ["default", "imagenet"])
def test_encoded_example_parses_back(schema_name):
    parsed = parse(schema.encode_example(VALUES, schema_name), schema_name)
    for role, value in VALUES.items():
        expected = value.encode("utf-8") if isinstance(value, str) else value
        assert parsed[role] == expected, role


def test_bytes_equal_the_protobuf_serialisation():
    example = tf.train.Example.FromString(schema.encode_example(VALUES))
    assert example.features.feature["label"].int64_list.value == [7]
    assert example.features.feature["image"].bytes_list.value == [VALUES["image"]]


@pytest.mark.parametrize("size", [0, 1, 127, 128, 16_383, 16_384, 2_097_152])
def test_every_length_encodes_exactly(size):
    """Headers worked out from lengths: each varint width of the nested lengths, parsed whole."""
    values = dict(VALUES, image=bytes(range(256)) * (size // 256) + b"x" * (size % 256), key="k" * (size % 300))
    serialized = schema.encode_example(values)
    example = tf.train.Example.FromString(serialized)
    assert example.ByteSize() == len(serialized)  # nothing more, nothing less
    assert example.features.feature["image"].bytes_list.value == [values["image"]]
    assert example.features.feature["key"].bytes_list.value == [values["key"].encode()]
    assert example.features.feature["width"].int64_list.value == [2**40]


def test_negative_and_zero_ints():
    values = dict(VALUES, label=-1, height=0)
    parsed = parse(schema.encode_example(values), "default")
    assert parsed["label"] == -1 and parsed["height"] == 0


def test_imagenet_names_are_the_tf_slim_ones():
    names = schema.names("imagenet")
    assert names["image"] == "image/encoded" and names["label"] == "image/class/label"
    assert set(names) == set(schema.ROLES)


def test_unknown_schema_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown schema 'coco'"):
        schema.names("coco")


@pytest.mark.parametrize("schema_name", ["default", "imagenet"])
def test_decode_example_reads_tensorflow_serialised_records(schema_name):
    names = schema.names(schema_name)
    feature = {}
    for role, value in VALUES.items():
        if isinstance(value, int):
            feature[names[role]] = tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))
        else:
            data = value.encode("utf-8") if isinstance(value, str) else value
            feature[names[role]] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[data]))
    feature["extra/floats"] = tf.train.Feature(float_list=tf.train.FloatList(value=[0.5, -2.0]))
    serialized = tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()
    decoded = schema.decode_example(serialized)
    assert decoded["extra/floats"] == [0.5, -2.0]
    record = schema.by_role(serialized, schema_name)
    for role, value in VALUES.items():
        assert record[role] == (value.encode("utf-8") if isinstance(value, str) else value)
    assert schema.by_role(schema.encode_example(dict(VALUES, label=-3)), "default")["label"] == -3


def test_decode_example_errors():
    with pytest.raises(ValueError, match="no feature 'image'"):
        schema.by_role(b"", "default")
    with pytest.raises(ValueError, match="truncated"):
        schema.decode_example(schema.encode_example(VALUES)[:-5])
