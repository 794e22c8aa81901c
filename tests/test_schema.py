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
