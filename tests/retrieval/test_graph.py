"""The training graph (retrieval/graph.py): built from triples, stored in a bundle, read back; which
texts it links to a query, by text."""
import numpy as np
import pytest

from relsearch.retrieval.graph import Graph
from relsearch.retrieval.prior import key

TRIPLES = [("Paris", "France"), ("Lyon", "France"), ("France", "Europe"), ("Paris", "France"), ("Rome", "Rome")]


def test_a_graph_links_both_ends_of_each_triple_once_and_round_trips():
    graph = Graph.build(TRIPLES)
    assert len(graph.edges) == 3  # the repeated pair once, the self-link not at all
    assert graph.neighbours("France") == {key("Paris"), key("Lyon"), key("Europe")}
    assert graph.neighbours("Paris") == {key("France")} and graph.neighbours("Rome") == set()
    assert graph.neighbours("Berlin") == set()
    again = Graph.from_json(graph.to_json())
    assert again.nodes == graph.nodes and np.array_equal(again.edges, graph.edges)
    assert all(again.neighbours(t) == graph.neighbours(t) for t in ("France", "Paris", "Europe"))


def test_linked_marks_every_copy_of_a_linked_text():
    graph = Graph.build(TRIPLES)
    texts = ["France", "Paris", "Berlin", "France", "Europe"]
    linked = graph.linked(["Paris", "France", "Berlin"], texts)
    assert linked.tolist() == [[True, False, False, True, False], [False, True, False, False, True], [False] * 5]


@pytest.mark.parametrize("entry", [None, [], {"key": "md5", "nodes": [], "edges": ""},
                                   {"key": "sha1-16", "nodes": ["a"], "edges": "not base64!"},
                                   {"key": "sha1-16", "nodes": ["a", "b"], "edges": "AAAAAAEAAAACAAAA"},  # 3 numbers
                                   {"key": "sha1-16", "nodes": ["a"], "edges": "AAAAAAEAAAA="}])  # node 1 of 1
def test_a_malformed_graph_is_named(entry):
    with pytest.raises(ValueError, match="malformed graph"):
        Graph.from_json(entry)
