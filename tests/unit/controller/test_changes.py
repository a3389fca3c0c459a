"""What to plan again: marked as changes come, taken whole by a plan."""

from __future__ import annotations

from cni.controller.changes import Changes
from cni.policy.model import EVERYTHING
from cni.policy.published.sets import AddressSetKey
from cni.policy.selectors import PodGroup

SET = AddressSetKey(PodGroup("x", None, EVERYTHING))
OTHER = AddressSetKey(PodGroup("y", None, EVERYTHING))


def test_a_sets_changed_pods_add_up_until_every_shard_is_due() -> None:
    changes = Changes()
    changes.set_pods(SET, [("x", "a")])
    changes.set_pods(SET, [("x", "b")])
    assert changes.sets == {SET: {("x", "a"), ("x", "b")}}
    changes.whole_set(SET)
    changes.set_pods(SET, [("x", "c")])
    assert changes.sets == {SET: None}


def test_a_retired_set_is_deleted_not_written_until_a_policy_reads_it_again() -> None:
    changes = Changes()
    changes.set_pods(SET, [("x", "a")])
    changes.retire_set(SET, "as-1")
    assert changes.sets == {} and changes.retired == {SET: "as-1"}
    changes.revive_set(SET)
    assert changes.sets == {SET: None} and changes.retired == {}


def test_take_hands_over_everything_and_leaves_nothing_marked() -> None:
    changes = Changes()
    assert not changes
    changes.policy(("x", "p"))
    changes.node("n0")
    changes.whole_set(SET)
    changes.retire_set(OTHER, "as-2")
    changes.sweep = True
    assert changes.counts() == {"policies": 1, "addressSets": 1, "nodes": 1}
    taken = changes.take()
    assert taken.policies == {("x", "p")} and taken.nodes == {"n0"}
    assert taken.sets == {SET: None} and taken.retired == {OTHER: "as-2"} and taken.sweep
    assert not changes and changes.retired == {}
    assert changes.counts() == {"policies": 0, "addressSets": 0, "nodes": 0}


def test_each_kind_of_mark_alone_is_something_to_plan() -> None:
    for mark in (
        lambda c: c.policy(("x", "p")),
        lambda c: c.node("n0"),
        lambda c: c.whole_set(SET),
        lambda c: c.set_pods(SET, [("x", "a")]),
        lambda c: setattr(c, "sweep", True),
    ):
        changes = Changes()
        mark(changes)
        assert changes
