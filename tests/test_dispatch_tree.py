"""provable_kernels.dispatch: a malformed tree is refused when it is built, a condition answering outside its
outcomes is a DispatchError, and the helpers the traces use (docs, conditions, path_to) say what they should."""
import pytest

from provable_kernels.dispatch import Branch, Condition, DispatchError, Route, Tree, recording


def ask_sign(x: int) -> str:
    """Is x negative?"""
    return "negative" if x < 0 else "other"


def negate(x: int) -> int:
    """Negate x."""
    return -x


SIGN = Condition("sign", ask_sign, ("negative", "other"))


def test_a_route_id_twice_is_refused():
    with pytest.raises(ValueError, match="route id 'toy.same' appears twice in tree 'toy'"):
        Tree("toy", Branch(SIGN, {"negative": Route("toy.same", negate), "other": Route("toy.same", abs)}))


def test_a_branch_without_a_child_per_outcome_is_refused():
    with pytest.raises(ValueError, match=r"branch on 'sign' must have exactly one child per outcome .*\['other'\]"):
        Tree("toy", Branch(SIGN, {"negative": Route("toy.neg", negate)}))


def test_an_undeclared_outcome_is_a_dispatch_error():
    liar = Condition("sign", lambda x: "zero", ("negative", "other"))
    tree = Tree("toy", Branch(liar, {"negative": Route("toy.neg", negate), "other": Route("toy.abs", abs)}))
    with pytest.raises(DispatchError, match=r"condition 'sign' answered 'zero', expected one of \['negative', 'other'\]"):
        tree.dispatch(3)


def test_trace_helpers():
    tree = Tree("toy", Branch(SIGN, {"negative": Route("toy.neg", negate), "other": Route("toy.abs", abs)}))
    with recording() as taken:
        assert tree.dispatch(-2) == 2 and tree.dispatch(5) == 5
    assert taken == ["toy.neg", "toy.abs"]
    assert SIGN.doc == "Is x negative?" and tree.routes()[0].doc == "Negate x."
    assert tree.conditions() == [SIGN]
    assert tree.path_to("toy.abs") == {"sign": "other"}
    with pytest.raises(KeyError, match="no route 'toy.none' in tree 'toy'"):
        tree.path_to("toy.none")
