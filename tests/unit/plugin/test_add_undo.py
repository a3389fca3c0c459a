"""ADD's undo: steps undone backwards, each even when an earlier undo fails, the
step's own error the one that propagates, nothing undone once committed."""

from __future__ import annotations

import pytest

from cni.plugin.verbs.add import Undo
from cni.spec.errors import ERR_TRY_AGAIN, CNIError


def test_a_failure_undoes_every_step_taken_backwards_and_keeps_its_own_error() -> None:
    undone: list[str] = []

    def broken() -> None:
        undone.append("masquerade")
        raise OSError("nft refused")

    with pytest.raises(CNIError) as raised, Undo("pod/eth0") as undo:
        undo.push("release the address", lambda: undone.append("address"))
        undo.push("remove the veth", lambda: undone.append("veth"))
        undo.push("stop masquerading", broken)
        undo.push("forget the policy", lambda: undone.append("policy"))
        raise CNIError(ERR_TRY_AGAIN, "the agent's sources have not synced")
    assert raised.value.code == ERR_TRY_AGAIN
    assert undone == ["policy", "masquerade", "veth", "address"]


def test_a_committed_block_undoes_nothing() -> None:
    undone: list[str] = []
    with Undo("pod/eth0") as undo:
        undo.push("remove the veth", lambda: undone.append("veth"))
        undo.commit()
    assert undone == []


def test_a_step_not_taken_has_no_undo() -> None:
    undone: list[str] = []
    with pytest.raises(KeyboardInterrupt), Undo("pod/eth0") as undo:
        undo.push("remove the veth", lambda: undone.append("veth"))
        raise KeyboardInterrupt  # a signal between steps: what was taken is undone
    assert undone == ["veth"]
