"""What each node's PolicyTargets list, and where each policy selects pods."""

from __future__ import annotations

from cni.controller.changes import Changes
from cni.controller.targets import NodeChange, Selection, Targets

A, B = ("x", "a"), ("x", "b")
P, Q = ("x", "p"), ("x", "q")


def targets() -> tuple[Targets, Changes]:
    changes = Changes()
    return Targets(changes), changes


def test_a_policys_first_pod_on_a_node_is_reported_and_the_next_is_not() -> None:
    held, changes = targets()
    assert held.select(A, Selection("n0", "u1", ("p",))) == [NodeChange(P, "n0", +1)]
    taken = changes.take()
    assert taken.nodes == {"n0"} and taken.policies == {P}
    assert held.select(B, Selection("n0", "u2", ("p", "q"))) == [NodeChange(Q, "n0", +1)]
    taken = changes.take()
    assert taken.nodes == {"n0"} and taken.policies == {Q}
    assert held.pods_on("n0") == [A, B] and held.pods_of(P) == {A, B}
    assert held.nodes_of(P) == ["n0"] and held.selection(B).uid == "u2"
    assert held.nodes() == {"n0"} and held.runs_pods("n0") and not held.runs_pods("n1")


def test_the_same_selection_again_changes_nothing() -> None:
    held, changes = targets()
    held.select(A, Selection("n0", "u1", ("p",)))
    changes.take()
    assert held.select(A, Selection("n0", "u1", ("p",))) == []
    assert not changes


def test_a_new_uid_rewrites_the_nodes_targets_but_no_policy() -> None:
    held, changes = targets()
    held.select(A, Selection("n0", "u1", ("p",)))
    changes.take()
    # Its policies' counts go down and up again: both steps, in order.
    moved = held.select(A, Selection("n0", "u9", ("p",)))
    assert moved == [NodeChange(P, "n0", -1), NodeChange(P, "n0", +1)]
    assert held.selection(A).uid == "u9" and changes.take().nodes == {"n0"}


def test_a_pod_moving_node_moves_its_policies_nodes() -> None:
    held, changes = targets()
    held.select(A, Selection("n0", "u1", ("p",)))
    changes.take()
    assert held.select(A, Selection("n1", "u1", ("p",))) == [
        NodeChange(P, "n0", -1),
        NodeChange(P, "n1", +1),
    ]
    taken = changes.take()
    assert taken.nodes == {"n0", "n1"} and taken.policies == {P}
    assert held.nodes_of(P) == ["n1"] and held.pods_on("n0") == []
    assert held.nodes() == {"n1"}


def test_a_pod_listed_nowhere_leaves_no_trace() -> None:
    held, changes = targets()
    held.select(A, Selection("n0", "u1", ("p",)))
    held.select(B, Selection("n0", "u2", ()))
    changes.take()
    assert held.select(A, None) == [NodeChange(P, "n0", -1)]
    assert held.pods_of(P) == set() and held.nodes_of(P) == []
    assert held.pods_on("n0") == [B] and changes.take().nodes == {"n0"}
    assert held.select(B, None) == []
    assert held.nodes() == set() and held.select(B, None) == []
