"""One object's fields read as the API server validates them (``FieldReader``): every
error names the object, the field path and the value."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from cni.policy.errors import PolicyInputError
from cni.policy.fields import FieldReader
from cni.policy.model import Requirement


def error(call: Callable[[], object]) -> str:
    with pytest.raises(PolicyInputError) as caught:
        call()
    return str(caught.value)


def test_errors_name_the_kind_until_the_metadata_names_the_object() -> None:
    reader = FieldReader("Pod")
    assert error(lambda: reader.integer("80", "spec.port", 1, 65535)).startswith("Pod: ")
    assert reader.metadata({"metadata": {"name": "a"}}, namespaced=True) == ("default", "a")
    message = error(lambda: reader.integer(0, "spec.port", 1, 65535))
    assert message.startswith("Pod default/a: spec.port 0") and "between 1 and 65535" in message


def test_an_api_version_may_be_left_out_but_not_be_another() -> None:
    reader = FieldReader("NetworkPolicy")
    reader.api_version({})
    reader.api_version({"apiVersion": "networking.k8s.io/v1"})
    assert "is not networking.k8s.io/v1" in error(lambda: reader.api_version({"apiVersion": "v1"}))


def test_names_and_labels_follow_the_api_servers_rules() -> None:
    reader = FieldReader("Namespace")
    assert "not a valid name" in error(lambda: reader.metadata({"metadata": {"name": "A"}}, False))
    assert reader.label_key("example.com/app", "k") == "example.com/app"
    assert "not a valid label key" in error(lambda: reader.label_key("a/b/c", "k"))
    assert reader.label_value("", "v") == ""
    assert "quote it in YAML" in error(lambda: reader.label_value(1, "v"))
    assert reader.port_name("http", "p") == "http"
    assert "not a valid port name" in error(lambda: reader.port_name("80", "p"))


def test_a_selector_is_canonical_so_equal_ones_are_equal() -> None:
    reader = FieldReader("NetworkPolicy")
    b_in = {"key": "b", "operator": "In", "values": ["2", "1"]}
    a_exists = {"key": "a", "operator": "Exists"}
    one = reader.selector({"matchExpressions": [b_in, a_exists, b_in]}, "s")
    other = reader.selector({"matchExpressions": [a_exists, b_in]}, "s")
    assert one == other
    assert one.match_expressions == (
        Requirement("a", "Exists", frozenset()),
        Requirement("b", "In", frozenset({"1", "2"})),
    )
    assert "must not be empty" in error(
        lambda: reader.selector({"matchExpressions": [{"key": "a", "operator": "In"}]}, "s")
    )


def test_addresses_are_read_as_the_api_servers_legacy_parser_does() -> None:
    reader = FieldReader("Pod")
    assert reader.ip("010.0.0.1", "status.podIP") == "10.0.0.1"
    assert str(reader.cidr("10.0.0.0/8", "cidr")) == "10.0.0.0/8"
    assert "is not a valid CIDR" in error(lambda: reader.cidr("10.0.0.0/33", "cidr"))
