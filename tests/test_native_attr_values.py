"""The native attribute access of instance attributes (``_native/py_attr.hpp``): where a plain
class keeps them among its instances' own attributes (CPython 3.11: inline values, or the dict
made of them), they are read and set there, and everything else goes through Python's own
access, with the same results."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import pytest

from radixsched.native import core

OWN = sys.version_info[:2] == (3, 11)  # the only layout the fast path reads

pytestmark = pytest.mark.skipif(core() is None, reason="the native core is not built")


class Plain:
    def __init__(self) -> None:
        self.x: Any = 1
        self.y: Any = [2]


def entry(o: object, name: str) -> tuple[int, int, bool, int]:
    """(slot read, slot written, own attributes read in place, index in the shared keys)."""
    got: tuple[int, int, bool, int] = core()._attr_entry(o, name)  # type: ignore[union-attr]
    return got


def test_an_instance_attribute_is_read_and_replaced_in_its_inline_values() -> None:
    c: Any = core()
    a = Plain()
    assert c._get_attr(a, "x") == 1 and c._get_attr(a, "y") == [2]
    # x and y in the order __init__ set them
    assert entry(a, "y") == ((-1, -1, True, 1) if OWN else (-1, -1, False, -1))
    assert entry(a, "x") == ((-1, -1, True, 0) if OWN else (-1, -1, False, -1))
    old, new = object(), object()
    c._set_attr(a, "x", old)
    held = sys.getrefcount(old)
    c._set_attr(a, "x", new)  # the old value let go of, the new one held
    assert a.x is new and sys.getrefcount(old) == held - 1
    assert c._get_attr(Plain(), "y") == [2]  # another instance, its own values
    assert vars(a) == {"x": new, "y": [2]}  # the order and the dict Python makes of them


def test_an_unset_or_unknown_attribute_goes_through_python() -> None:
    c: Any = core()
    a = Plain()
    c._get_attr(a, "x")
    assert entry(a, "nope")[2:] == (False, -1)  # no instance has it: not checked, not read
    with pytest.raises(AttributeError):
        c._get_attr(a, "nope")
    del a.x
    with pytest.raises(AttributeError):
        c._get_attr(a, "x")  # an unset value raises as Python's access does
    c._set_attr(a, "x", 3)  # set anew by Python: back in the values, last in order
    assert a.x == 3 and list(vars(a)) == ["y", "x"]


def test_an_instance_whose_dict_was_made_is_read_and_set_in_it() -> None:
    c: Any = core()
    a = Plain()
    c._get_attr(a, "x")  # the entry filled
    d = a.__dict__  # the values moved into a dict
    c._set_attr(a, "x", 5)
    assert d["x"] == 5 and c._get_attr(a, "x") == 5
    d["y"] = 6
    assert c._get_attr(a, "y") == 6
    del d["y"]
    with pytest.raises(AttributeError):
        c._get_attr(a, "y")
    c._set_attr(a, "z", 7)  # a new name: into the dict
    assert d["z"] == 7


def test_a_class_of_many_attributes_keeps_them_in_a_dict() -> None:
    """Past the shared keys' room (30 names) an instance's attributes are a dict from the
    start: read and set there."""
    c: Any = core()

    class Many:
        def __init__(self) -> None:
            for i in range(40):
                setattr(self, f"a{i}", i)

    m = Many()
    assert [c._get_attr(m, f"a{i}") for i in range(40)] == list(range(40))
    assert entry(m, "a39")[2] is OWN
    c._set_attr(m, "a39", "z")
    c._set_attr(m, "a0", "y")
    assert m.a39 == "z" and m.a0 == "y" and len(vars(m)) == 40


def test_a_default_in_the_class_is_read_where_the_instance_has_none() -> None:
    """A class attribute that is no descriptor (a dataclass default) yields to the instance's
    own; one whose type is a Python class is left to Python (its class may become one)."""
    c: Any = core()

    @dataclasses.dataclass
    class D:
        n: int = 0

    class Marker:
        pass

    class K:
        tag: Any = Marker()

        def __init__(self) -> None:
            self.tag = 1

    d = D(5)
    assert c._get_attr(d, "n") == 5 and entry(d, "n")[2] is OWN
    c._set_attr(d, "n", 6)
    assert d.n == 6 and D.n == 0
    del d.n
    assert c._get_attr(d, "n") == 0  # the class's, through Python
    k = K()
    assert c._get_attr(k, "tag") == 1 and entry(k, "tag")[2] is False
    Marker.__get__ = lambda self, o, t=None: "descr"  # type: ignore[attr-defined]
    Marker.__set__ = lambda self, o, v: None  # type: ignore[attr-defined]
    assert c._get_attr(k, "tag") == "descr"  # now a data descriptor: it wins


def test_a_class_change_is_seen_at_once() -> None:
    c: Any = core()

    class K:
        def __init__(self) -> None:
            self.v = 1

    k = K()
    assert c._get_attr(k, "v") == 1 and entry(k, "v")[2] is OWN
    K.v = property(lambda self: "p")  # type: ignore[assignment,method-assign]
    assert c._get_attr(k, "v") == "p"  # a data descriptor now wins over the instance value
    assert entry(k, "v")[2:] == (False, -1)
    with pytest.raises(AttributeError):
        c._set_attr(k, "v", 2)  # a property without a setter


def test_custom_attribute_hooks_are_called() -> None:
    """A class with its own __getattribute__ or __setattr__ has it called on every access."""
    c: Any = core()
    calls: list[str] = []

    class G:
        def __init__(self) -> None:
            self.v = 1

        def __getattribute__(self, name: str) -> Any:
            calls.append(name)
            return object.__getattribute__(self, name)

    class S:
        def __init__(self) -> None:
            self.v = 1

        def __setattr__(self, name: str, value: Any) -> None:
            calls.append(name)
            object.__setattr__(self, name, value)

    g, s = G(), S()
    calls.clear()
    assert c._get_attr(g, "v") == 1 and c._get_attr(g, "v") == 1
    assert calls == ["v", "v"]
    calls.clear()
    c._set_attr(s, "v", 2)
    c._set_attr(s, "v", 3)
    assert calls == ["v", "v"] and s.v == 3
    assert entry(g, "v")[2] is False and entry(s, "v")[2] is False


def test_a_property_is_called_even_where_it_gives_the_instance_value() -> None:
    """A data descriptor wins over the instance's own attributes, whatever it returns."""
    c: Any = core()
    calls: list[str] = []

    class P:
        @property
        def v(self) -> Any:
            calls.append("v")
            return self.__dict__["v"]

    p = P()
    p.__dict__["v"] = [1]
    assert c._get_attr(p, "v") is p.__dict__["v"] and c._get_attr(p, "v") == [1]
    assert calls == ["v", "v"]
