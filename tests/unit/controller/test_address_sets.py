"""The address sets in use: made by their first reader, retired with their last, and
labelled for the nodes where their readers select pods."""

from __future__ import annotations

from cni.controller.address_sets import AddressSets
from cni.controller.changes import Changes
from cni.policy.model import EVERYTHING, LabelSelector, labels_of
from cni.policy.published.names import address_set_id
from cni.policy.published.sets import AddressSetKey
from cni.policy.selectors import PodGroup

WEB = PodGroup("x", None, LabelSelector(labels_of({"role": "web"})))
DB = PodGroup("x", None, LabelSelector(labels_of({"role": "db"})))
ALL = PodGroup("x", None, EVERYTHING)
P, Q = ("x", "p"), ("x", "q")


def in_use() -> tuple[AddressSets, Changes]:
    changes = Changes()
    return AddressSets(changes), changes


def test_the_first_reader_makes_the_set_and_every_shard_is_written() -> None:
    sets, changes = in_use()
    web, db = AddressSetKey(WEB), AddressSetKey(DB)
    sets.use(P, (web, db), nodes=())
    assert changes.take().sets == {web: None, db: None}
    made = sets.get(web)
    assert made is not None and made.users == {P} and made.shards == 0
    assert made.id == address_set_id(web) and sets.key_of(made.id) == web
    assert sets.ids_of(P) == [address_set_id(web), address_set_id(db)]
    # A second reader writes nothing.
    sets.use(Q, (web,), nodes=())
    assert not changes and sets.get(web) is made and made.users == {P, Q}
    assert len(sets) == 2 and {s.key for s in sets} == {web, db}


def test_the_last_reader_gone_retires_the_set() -> None:
    sets, changes = in_use()
    web = AddressSetKey(WEB)
    sets.use(P, (web,), nodes=())
    sets.use(Q, (web,), nodes=())
    set_id = address_set_id(web)
    changes.take()
    sets.use(P, (), nodes=())
    assert sets.get(web) is not None and not changes.take().retired
    sets.use(Q, (), nodes=())
    assert sets.get(web) is None and sets.key_of(set_id) is None and sets.ids_of(Q) == []
    assert changes.take().retired == {web: set_id}
    # Read again before a plan deleted it: written again, not deleted.
    sets.use(P, (web,), nodes=())
    taken = changes.take()
    assert taken.retired == {} and taken.sets == {web: None}


def test_a_set_is_labelled_for_a_node_while_a_reader_selects_a_pod_there() -> None:
    sets, changes = in_use()
    web = AddressSetKey(WEB)
    sets.use(P, (web,), nodes=["n0"])
    sets.use(Q, (web,), nodes=[])
    state = sets.get(web)
    assert state is not None and dict(state.nodes) == {"n0": 1}
    changes.take()
    sets.policy_node(Q, "n0", +1)  # a second reader on n0: the label stays as it is
    assert dict(state.nodes) == {"n0": 2} and not changes
    sets.policy_node(Q, "n1", +1)  # the first on n1: every shard gets its label
    assert changes.take().sets == {web: None}
    sets.policy_node(P, "n0", -1)
    assert dict(state.nodes) == {"n0": 1, "n1": 1} and not changes
    sets.use(Q, (), nodes=["n0", "n1"])  # Q's nodes go with it
    assert sets.get(web) is state and dict(state.nodes) == {}
    assert changes.take().sets == {web: None}


def test_a_policy_that_stops_reading_a_set_takes_its_nodes_away() -> None:
    sets, changes = in_use()
    web, db = AddressSetKey(WEB), AddressSetKey(DB)
    sets.use(P, (web,), nodes=["n0"])
    sets.use(Q, (web, db), nodes=["n1"])
    changes.take()
    sets.use(Q, (db,), nodes=["n1"])
    state = sets.get(web)
    assert state is not None and dict(state.nodes) == {"n0": 1}
    assert changes.take().sets == {web: None}  # its n1 label goes


def test_group_changes_mark_the_sets_drawing_from_those_groups() -> None:
    sets, changes = in_use()
    web, web_ports, db = AddressSetKey(WEB), AddressSetKey(WEB, ports=True), AddressSetKey(DB)
    sets.use(P, (web, web_ports, db), nodes=())
    changes.take()
    sets.groups_changed({WEB}, {("x", "a")})
    sets.groups_changed({WEB, ALL}, {("x", "b")})
    assert changes.take().sets == {
        web: {("x", "a"), ("x", "b")},
        web_ports: {("x", "a"), ("x", "b")},
    }
    sets.groups_changed({DB}, None)  # a namespace's labels: too many pods to tell
    assert changes.take().sets == {db: None}
