"""Op.batch: the documented optional batch mark, kept in the JSON schema."""
import json

import pytest

from pesto.errors import InvalidGraphError
from pesto.graph import Edge, Op, OpGraph, Tensor


def _graph(marks=(True, False)):
    ops = [Op("a", {"GPU": 1.0}, output_bytes=8, batch=marks[0]), Op("b", {"GPU": 2.0}, batch=marks[1])]
    return OpGraph(ops, [Edge("a", "b", ("a:0",))], [Tensor("a:0", "a", 8)], name="g")


def test_marks_survive_json_and_networkx():
    g = _graph()
    back = OpGraph.from_json(g.to_json())
    assert [op.batch for op in back.ops] == [True, False]
    assert back == g
    assert [op.batch for op in OpGraph.from_networkx(g.to_networkx()).ops] == [True, False]


def test_old_files_load_unknown_and_unknown_is_not_written():
    d = _graph().to_dict()
    for o in d["ops"]:
        del o["batch"]
    g = OpGraph.from_dict(d)
    assert [op.batch for op in g.ops] == [None, None]
    assert all("batch" not in o for o in json.loads(g.to_json())["ops"])


def test_marks_take_part_in_equality_and_hash():
    assert _graph((True, False)) != _graph((False, False))
    assert hash(_graph().ops[0]) != hash(_graph((False, False)).ops[0])


@pytest.mark.parametrize("bad", [1, 0, "yes", 1.0])
def test_a_mark_that_is_not_a_bool_names_the_op(bad):
    with pytest.raises(InvalidGraphError, match=r"op 'x': batch must be true, false or null"):
        OpGraph([Op("x", {"GPU": 1.0}, batch=bad)])
    d = _graph().to_dict()
    d["ops"][1]["batch"] = bad
    with pytest.raises(InvalidGraphError, match="op 'b'"):
        OpGraph.from_dict(d)
