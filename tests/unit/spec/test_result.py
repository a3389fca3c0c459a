"""Results in every spec version: read (prevResult, a delegate's answer), written,
chained."""

from __future__ import annotations

import pytest

from cni.spec.errors import CNIError
from cni.spec.result import DNS, Interface, IPConfig, Result, Route, chain
from cni.spec.versions import SUPPORTED

RESULT = Result(
    "1.1.0",
    interfaces=[
        Interface("sl0123456789ab", "ee:ee:ee:ee:ee:ee", 1400),
        Interface("eth0", "0a:58:0a:00:00:05", 1400, sandbox="/run/netns/p"),
    ],
    ips=[IPConfig("10.0.0.5/24", "169.254.1.1", interface=1)],
    routes=[Route("0.0.0.0/0", "169.254.1.1", priority=10)],
    dns=DNS(nameservers=["10.96.0.10"], search=["svc.cluster.local"]),
)


@pytest.mark.parametrize("version", SUPPORTED)
def test_round_trip_in_every_version(version: str) -> None:
    written = RESULT.to_json(version)
    assert written["cniVersion"] == version
    back = Result.from_json(written, version)
    assert [ip.address for ip in back.ips] == ["10.0.0.5/24"]
    assert back.dns.nameservers == ["10.96.0.10"]


def test_version_specific_fields() -> None:
    legacy = RESULT.to_json("0.2.0")
    assert legacy["ip4"] == {
        "ip": "10.0.0.5/24",
        "gateway": "169.254.1.1",
        "routes": [{"dst": "0.0.0.0/0", "gw": "169.254.1.1"}],
    }
    assert RESULT.to_json("0.4.0")["ips"][0]["version"] == "4"
    assert "version" not in RESULT.to_json("1.0.0")["ips"][0]
    assert "mtu" not in RESULT.to_json("1.0.0")["interfaces"][0]
    assert RESULT.to_json("1.1.0")["interfaces"][0]["mtu"] == 1400
    assert RESULT.to_json("1.1.0")["routes"][0]["priority"] == 10
    assert "priority" not in RESULT.to_json("1.0.0")["routes"][0]


def test_a_legacy_result_without_addresses_cannot_be_written() -> None:
    with pytest.raises(CNIError) as err:
        Result("0.2.0").to_json("0.2.0")
    assert err.value.code == 6


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ({"ips": [{"address": "10.0.0.5"}]}, "no prefix length"),
        ({"ips": [{"address": "10.0.0.5/24", "gateway": "x"}]}, "gateway"),
        ({"interfaces": [{"name": 5}]}, "interfaces[0].name"),
        ({"routes": "nope"}, "routes must be a list"),
        ({"cniVersion": "7.0.0"}, "7.0.0"),
    ],
)
def test_bad_results_name_the_field(data: dict[str, object], fragment: str) -> None:
    with pytest.raises(CNIError) as err:
        Result.from_json(data, "1.0.0", where="prevResult")
    assert err.value.code == 6 and fragment in err.value.details


def test_chaining_keeps_earlier_entries_and_shifts_interfaces() -> None:
    prev = Result(
        "1.0.0",
        interfaces=[Interface("other0")],
        ips=[IPConfig("192.168.0.2/24", interface=0)],
        dns=DNS(nameservers=["1.1.1.1"]),
    )
    ours = Result("1.0.0", interfaces=RESULT.interfaces, ips=list(RESULT.ips))
    chained = chain(prev, ours)
    assert [i.name for i in chained.interfaces] == ["other0", "sl0123456789ab", "eth0"]
    assert [ip.interface for ip in chained.ips] == [0, 2]
    assert chained.dns.nameservers == ["1.1.1.1"]  # ours has none
    assert ours.ips[0].interface == 1  # not modified in place
    assert chain(None, ours) is ours
