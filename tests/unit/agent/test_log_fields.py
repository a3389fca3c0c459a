"""Every log line of a CNI call names the verb, the container and the pod."""

from __future__ import annotations

import json
import logging
import threading

from cni.agent import log_fields
from cni.agent.daemon import JSONLines

ENV = {
    "CNI_COMMAND": "ADD",
    "CNI_CONTAINERID": "c0ffee",
    "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web-0;K8S_POD_UID=u",
}


def line(message: str) -> dict[str, str]:
    record = logging.LogRecord("sluice.agent", logging.INFO, __file__, 1, message, None, None)
    decoded: dict[str, str] = json.loads(JSONLines().format(record))
    return decoded


def test_lines_logged_during_a_call_carry_its_fields_and_no_others_do() -> None:
    assert "pod" not in line("before")
    with log_fields.for_call(ENV):
        during = line("wiring")
        other: dict[str, str] = {}
        thread = threading.Thread(target=lambda: other.update(line("elsewhere")))
        thread.start()
        thread.join()
    assert during["msg"] == "wiring"
    assert {k: during[k] for k in ("verb", "container_id", "namespace", "pod")} == {
        "verb": "ADD", "container_id": "c0ffee", "namespace": "shop", "pod": "web-0"
    }  # fmt: skip
    assert "pod" not in other, "another thread's lines are not the call's"
    assert "pod" not in line("after")


def test_fields_of_a_malformed_environment_are_what_can_be_read() -> None:
    odd = {"CNI_COMMAND": "DEL", "CNI_ARGS": "garbage;;=x;K8S_POD_NAME=" + "p" * 400}
    assert log_fields.fields_of(odd) == {"verb": "DEL", "pod": "p" * log_fields.MAX_VALUE}
    assert log_fields.fields_of({}) == {}


def test_a_failed_calls_error_reads_as_one_line() -> None:
    out = '{"cniVersion": "1.1.0", "code": 7, "msg": "invalid configuration", "details": "x"}'
    assert log_fields.error_of(out) == "code 7 (invalid configuration): x"
    assert log_fields.error_of("not json\n") == "not json"
    assert log_fields.error_of("[]") == "[]"
    assert log_fields.error_of("") == "no output"
