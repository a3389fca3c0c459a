"""Address ownership on its own: an address two pods claim is neither's, unless one
of them is wired here and the other is not; a new endpoint waits while the API
still gives its address to another pod."""

from __future__ import annotations

from cni.policy.model import Pod, labels_of
from cni.policy.ownership import AddressOwnership, held_by_another
from cni.policy.store import ObjectStore

OLD = Pod("x", "old", labels_of({}), ("10.0.0.2", "10.0.0.3"), "n1", uid="u-old")
NEW = Pod("x", "new", labels_of({}), ("10.0.0.2",), "n1", uid="u-new")
ALONE = Pod("x", "alone", labels_of({}), ("10.0.0.9",), "n2", uid="u-alone")


def store_of(*pods: Pod) -> ObjectStore:
    store = ObjectStore()
    for pod in pods:
        store.put_pod(pod)
    return store


def test_a_shared_address_is_nobodys_until_one_claimant_is_wired_here() -> None:
    local: set[tuple[str, str]] = set()
    ownership = AddressOwnership(store_of(OLD, NEW, ALONE), local)
    assert ownership.owned_ips(OLD) == ("10.0.0.3",)
    assert ownership.peer_view(NEW).ips == ()
    assert ownership.peer_view(ALONE) is ALONE  # nothing to take away: the same pod
    local.add(NEW.key)  # this node wired the new pod: it gave it the address
    assert ownership.peer_view(NEW).ips == ("10.0.0.2",)
    assert ownership.owned_ips(OLD) == ("10.0.0.3",)
    local.add(OLD.key)  # both wired here (an ADD before the old DEL): neither
    assert ownership.peer_view(NEW).ips == ()


def test_contenders_are_the_other_claimants_of_any_address() -> None:
    ownership = AddressOwnership(store_of(OLD, NEW, ALONE), set())
    assert ownership.contenders(NEW.key, NEW.ips) == {OLD.key}
    assert ownership.contenders(OLD.key, OLD.ips) == {NEW.key}
    assert ownership.contenders(ALONE.key, ALONE.ips) == set()


def test_a_new_endpoint_waits_while_another_pod_holds_its_address() -> None:
    store = store_of(OLD, NEW)
    held = held_by_another(store, NEW.key, NEW.ips)
    assert held == "address 10.0.0.2 is still pod x/old's (uid u-old) as the API reports it"
    store.remove_pod(OLD.key)
    assert held_by_another(store, NEW.key, NEW.ips) is None
