"""What keeps the test set deterministic on a user's machine, checked over its own source."""

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).parents[1]


def tmux_commands(tree: ast.AST) -> list[ast.List]:
    """Every list literal that starts a tmux command: ["tmux", ...]."""
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.List)
        and node.elts
        and isinstance(node.elts[0], ast.Constant)
        and node.elts[0].value == "tmux"
    ]


def test_every_tmux_command_in_the_tests_names_its_own_socket():
    """`tmux -L NAME`: no test talks to the machine's default tmux server, where another user's or
    another tool's sessions live (one had made a served terminal test fail with "can't find pane")."""
    found, unnamed = 0, []
    for path in TESTS.rglob("*.py"):
        for command in tmux_commands(ast.parse(path.read_text())):
            found += 1
            second = command.elts[1] if len(command.elts) > 1 else None
            if not (isinstance(second, ast.Constant) and second.value == "-L"):
                unnamed.append(f"{path.relative_to(TESTS)}:{command.lineno}")
    assert found >= 3  # the check can fail: the helpers' commands are found
    assert unnamed == []


def test_two_paths_floats_are_compared_within_one_rounding_and_the_rest_exactly():
    """closeness.assert_close: a row computed in a batch of 8 and alone differ here in the last bits
    (the matrix kernel sums in another order), which it accepts; a real difference, another id or
    another length it refuses."""
    import torch
    from closeness import assert_close

    torch.manual_seed(0)
    weight, rows = torch.randn(4096, 576) * 0.05, torch.randn(8, 576)
    batched = torch.log_softmax(rows @ weight.T, -1)[3].tolist()
    alone = torch.log_softmax(rows[3:4] @ weight.T, -1)[0].tolist()
    assert batched != alone  # (what the tolerance is for)
    assert_close({"logits": alone, "id": 5}, {"logits": batched, "id": 5})
    for wrong in (
        {"logits": [v * 1.001 for v in alone], "id": 5},
        {"logits": alone, "id": 6},
        {"logits": alone[1:], "id": 5},
    ):
        with pytest.raises(AssertionError):
            assert_close(wrong, {"logits": batched, "id": 5})


def test_a_worker_leaves_the_terminal_size_to_the_terminals_it_starts():
    """pytest-xdist gives its workers COLUMNS=80 and LINES=24: a tokenviz started in a 200x60 tmux terminal
    took them for its size and drew 80x24 in a corner (seven terminal tests failed so)."""
    import os

    assert "COLUMNS" not in os.environ and "LINES" not in os.environ


def test_the_tests_that_share_a_server_or_a_build_share_a_worker(request):
    """Each test that needs the vLLM servers (or the llama-cpp-python build) is in that fixture's group:
    xdist runs a group on one worker, so the servers start once a run, not once a worker."""
    import workers

    for item in request.session.items:
        groups = {mark.args[0] for mark in item.iter_markers("xdist_group")}
        assert workers.groups(item) <= groups, item.nodeid
        if "vllm_server" in item.fixturenames or "llama_cpp" in item.fixturenames:
            assert groups, item.nodeid
    assert 2 <= workers.auto_workers() <= workers.MOST_WORKERS
