"""Objects of several kinds handed to one receiver: each kind is a Python type, and the
receiver registers what to do with an object of that type.

The agent's resolvers (``PolicyIndex``, ``ShardIndex``) and the controller's
``Publisher`` take objects from informers and manifests this one way:
``upsert(obj)``, ``delete(obj)`` and ``replace_all(kind, objects)`` (a relist),
where ``kind`` is the objects' type. Nothing dispatches on kind names.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class KindHandlers(Generic[R]):
    """What a receiver does with the objects of one kind.

    ``replace`` makes the receiver's objects of the kind exactly the given ones;
    without it, ``replace_by_key`` does it from ``current`` and ``key``.
    """

    upsert: Callable[[Any], R]
    delete: Callable[[Any], R]
    current: Callable[[], Iterable[Any]] | None = None
    key: Callable[[Any], Hashable] | None = None
    replace: Callable[[list[Any]], R] | None = None


class ByKind(Generic[R]):
    """Objects dispatched by their type to the handlers registered for it; results are
    merged with ``merge`` (the union of affected pods, for the resolvers)."""

    def __init__(
        self,
        handlers: Mapping[type, KindHandlers[R]],
        merge: Callable[[Iterable[R]], R],
        receiver: str,
    ) -> None:
        self._handlers = dict(handlers)
        self._merge = merge
        self._receiver = receiver

    def of(self, kind: type) -> KindHandlers[R]:
        handlers = self._handlers.get(kind)
        if handlers is None:
            raise TypeError(f"{self._receiver} takes no {kind.__name__}")
        return handlers

    def upsert(self, obj: Any) -> R:
        return self.of(type(obj)).upsert(obj)

    def delete(self, obj: Any) -> R:
        return self.of(type(obj)).delete(obj)

    def replace_all(self, kind: type, objects: Iterable[Any]) -> R:
        objects = list(objects)
        for obj in objects:  # before changing anything
            if type(obj) is not kind:
                raise TypeError(f"replace_all({kind.__name__}) got a {type(obj).__name__}")
        handlers = self.of(kind)
        if handlers.replace is not None:
            return handlers.replace(objects)
        assert handlers.current is not None and handlers.key is not None
        return replace_by_key(handlers, objects, self._merge)


def replace_by_key(
    handlers: KindHandlers[R], objects: list[Any], merge: Callable[[Iterable[R]], R]
) -> R:
    """Upsert each object, then delete those held whose key is not among them."""
    assert handlers.current is not None and handlers.key is not None
    key = handlers.key
    gone = {key(obj): obj for obj in handlers.current()}
    results = []
    for obj in objects:
        gone.pop(key(obj), None)
        results.append(handlers.upsert(obj))
    results.extend(handlers.delete(obj) for obj in gone.values())
    return merge(results)
