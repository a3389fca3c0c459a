"""The "datapath" object of the sluice plugin config."""

from __future__ import annotations

import pytest

from cni.datapath import settings
from cni.datapath.settings import DatapathSettings


def test_absent_means_the_defaults() -> None:
    assert settings.parse(None) == DatapathSettings()
    assert settings.from_plugin({"type": "sluice"}).conntrack_per_endpoint == 4096


def test_keys_map_to_fields_and_the_config_map() -> None:
    chosen = settings.parse(
        {"conntrackPerEndpoint": 1024, "maxEndpoints": 512, "eventsPerSecond": 0, "udpTimeout": 5}
    )
    assert chosen.conntrack_per_endpoint == 1024 and chosen.max_endpoints == 512
    fields = chosen.config_fields()
    assert fields["ct_per_endpoint"] == 1024 and fields["ct_udp"] == 5
    assert fields["events_per_second"] == 0
    assert chosen.compiled() == {"SL_MAX_ENDPOINTS": 512, "SL_MAX_SERVICES": 65536}


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ({"conntrackPerEndpoint": 0}, '"datapath.conntrackPerEndpoint" is 0'),
        ({"conntrackPerEndpoint": "big"}, "'big'"),
        ({"maxEndpoints": True}, "True"),
        ({"conntrackPerEndpont": 5}, '"conntrackPerEndpont"'),
        ({"attach": "clsact"}, "\"datapath.attach\" is 'clsact'"),
        ({"attach": 1}, '"datapath.attach" is 1'),
        ([1], "object"),
    ],
)
def test_errors_name_the_key_and_value(value: object, named: str) -> None:
    with pytest.raises(ValueError, match=named.replace("(", r"\(").replace('"', '"')) as err:
        settings.parse(value)
    assert named in str(err.value)


def test_attach_is_chosen_per_network_and_not_part_of_the_pinned_state() -> None:
    assert DatapathSettings().attach == "tcx"
    tc = settings.parse({"attach": "tc"})
    assert tc.attach == "tc"
    assert tc.config_fields() == DatapathSettings().config_fields()
    assert tc.compiled() == DatapathSettings().compiled()


def test_settings_are_frozen() -> None:
    with pytest.raises(AttributeError):
        DatapathSettings().max_endpoints = 1  # type: ignore[misc]
