"""Cell ids are stable hashes of the canonical cell; names are readable and unique."""

import hashlib

from soakmatrix.matrix.cells import Cell, parse_name
from soakmatrix.matrix.plan import plan
from soakmatrix.matrix.spec import load_matrix


def test_id_is_stable_and_independent_of_flag_order():
    a = Cell.make("glm", "H200", {"tp": 8, "mtp": 2, "async_scheduling": True}, "chat")
    b = Cell.make("glm", "H200", {"async_scheduling": True, "mtp": 2, "tp": 8}, "chat")
    assert a.id == b.id and len(a.id) == 12
    # pinned: changing the canonical form would orphan every stored history
    assert a.canonical() == ('{"flags":{"async_scheduling":true,"mtp":2,"tp":8},"gpu":"H200",'
                             '"model":"glm","workload":"chat"}')
    assert a.id == hashlib.sha256(a.canonical().encode()).hexdigest()[:12]


def test_id_changes_with_any_part():
    base = Cell.make("glm", "H200", {"tp": 8}, "chat")
    others = [Cell.make("glm2", "H200", {"tp": 8}, "chat"), Cell.make("glm", "H20", {"tp": 8}, "chat"),
              Cell.make("glm", "H200", {"tp": 4}, "chat"), Cell.make("glm", "H200", {"tp": 8}, "random"),
              Cell.make("glm", "H200", {"tp": 8, "mtp": 0}, "chat")]
    assert len({c.id for c in others} | {base.id}) == 6


def test_bool_and_int_values_give_different_ids():
    assert Cell.make("m", "g", {"x": True}, "w").id != Cell.make("m", "g", {"x": 1}, "w").id


def test_name_format_and_parse():
    cell = Cell.make("glm-5.1", "H200", {"tp": 8, "async_scheduling": False}, "chat")
    assert cell.name == "glm-5.1|H200|async_scheduling=false,tp=8|chat"
    assert parse_name(cell.name) == ("glm-5.1", "H200", {"async_scheduling": "false", "tp": "8"}, "chat")


def test_names_unique_across_example_plans(examples):
    for name in ["demo", "nightly", "smoke"]:
        result = plan(load_matrix(examples / f"{name}.yaml"))
        names = [pc.name for pc in result.cells]
        assert len(names) == len(set(names))
        assert len({pc.id for pc in result.cells}) == len(names)
