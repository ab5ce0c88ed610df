"""The all-or-nothing protocol of a weight update under tensor parallelism (tp_runner.py:
TPModelRunner.load_weights / reload_weights / _agree on rank 0, answer_plan / commit_plan on a
worker), driven with a fake group (scripted worker answers, recorded messages) and fake
planning, so every branch runs in this process without spawning a rank. The engines of
tests/worker/test_tp_weight_update.py show the same rules end to end.

Invariant checked: rank 0 commits (("commit_weights", True)) only when every worker answered
("weights_planned", None); otherwise it sends ("commit_weights", False) and raises the first
refusal, naming its rank; a worker applies only what it planned, and only on True."""

from __future__ import annotations

import pickle

import pytest
import torch

from enginespec.worker.tp_group import EngineDeadError
from enginespec.worker.tp_runner import TPModelRunner


class FakeConn:
    """A worker's pipe end on rank 0: its scripted answers, in order (an exception is raised)."""

    def __init__(self, *answers):
        self.answers = list(answers)

    def recv(self):
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer


class FakeGroup:
    """Rank 0's TensorParallel: records what is sent; dead_error / interrupted as the real one's
    results (an EngineDeadError, a mark)."""

    rank = 0

    def __init__(self, *conns):
        self.conns = list(conns)
        self.pickled, self.sent, self.interrupts = [], [], []

    def send_pickled(self, message):
        self.pickled.append(pickle.loads(pickle.dumps(message)))

    def send(self, message):
        self.sent.append(message)

    def dead_error(self, cause):
        return EngineDeadError(f"dead: {cause}")

    def interrupted(self, exc):
        self.interrupts.append(exc)


PLANNED = ("weights_planned", None)


def _runner(tp, plan=None) -> TPModelRunner:
    """A TPModelRunner with no model: plan_weights returns `plan(kind, source)` (or raises what
    it raises), commit_weights records the update and returns 7."""
    runner = TPModelRunner.__new__(TPModelRunner)
    runner.tp, runner._planned, runner.committed, runner.plans = tp, None, [], []

    def plan_weights(kind, source):
        runner.plans.append((kind, source))
        return plan(kind, source) if plan is not None else ("update", kind)

    def commit_weights(update):
        runner.committed.append(update)
        return 7

    runner.plan_weights, runner.commit_weights = plan_weights, commit_weights
    return runner


def test_every_worker_planned_commits_on_all_ranks():
    tp = FakeGroup(FakeConn(PLANNED), FakeConn(PLANNED), FakeConn(PLANNED))
    runner = _runner(tp)
    assert runner.reload_weights("/ckpt") == 7
    assert tp.pickled == [("plan_weights", "reload", "/ckpt")]
    assert tp.sent == [("commit_weights", True)]
    assert runner.committed == [("update", "reload")]


@pytest.mark.parametrize("error_type, raised", [("ValueError", ValueError), ("OSError", RuntimeError)])
def test_a_refusal_of_any_worker_drops_the_update_on_all_and_names_the_first_refusing_rank(
    error_type, raised
):
    """Rank 2 and rank 3 refuse: every worker is still heard (each pipe read once), then all
    are told to drop; the error is rank 2's, its type kept (ValueError) or named (any other,
    a RuntimeError: nothing was loaded); rank 0 commits nothing."""
    conns = [
        FakeConn(PLANNED),
        FakeConn(("weights_planned", (error_type, "tensor 'x' is bad"))),
        FakeConn(("weights_planned", ("ValueError", "tensor 'y' is bad"))),
    ]
    tp = FakeGroup(*conns)
    runner = _runner(tp)
    with pytest.raises(raised) as info:
        runner.reload_weights("/ckpt")
    text = str(info.value)
    assert text.startswith("tensor-parallel rank 2: ") and "tensor 'x' is bad" in text and "'y'" not in text
    if raised is RuntimeError:
        assert text == "tensor-parallel rank 2: OSError: tensor 'x' is bad; nothing was loaded"
        assert not isinstance(info.value, ValueError)
    else:
        assert text == "tensor-parallel rank 2: tensor 'x' is bad"
    assert tp.sent == [("commit_weights", False)] and runner.committed == []
    assert all(not c.answers for c in conns)


def test_a_dying_worker_is_the_engine_dead_naming_its_rank_and_its_traceback():
    """A worker answering ("error", traceback) is dying: EngineDeadError (the ranks are out of
    step), naming the rank and the traceback; no commit is sent."""
    tp = FakeGroup(FakeConn(PLANNED), FakeConn(("error", "Traceback: boom")))
    runner = _runner(tp)
    with pytest.raises(EngineDeadError, match=r"worker rank 2 answered 'error':\nTraceback: boom"):
        runner.reload_weights("/ckpt")
    assert tp.sent == [] and runner.committed == []


def test_an_interrupt_while_gathering_marks_the_group_out_of_step_and_propagates():
    stop = KeyboardInterrupt()
    tp = FakeGroup(FakeConn(stop))
    runner = _runner(tp)
    with pytest.raises(KeyboardInterrupt):
        runner.reload_weights("/ckpt")
    assert tp.interrupts == [stop] and tp.sent == [] and runner.committed == []


def test_rank_0s_own_refusal_reaches_no_worker():
    def refuse(kind, source):
        raise ValueError("unknown weight 'x'")

    tp = FakeGroup(FakeConn(PLANNED))
    runner = _runner(tp, refuse)
    with pytest.raises(ValueError, match="unknown weight 'x'"):
        runner.load_weights([("x", torch.ones(2))])
    assert tp.pickled == [] and tp.sent == [] and tp.conns[0].answers == [PLANNED]


def test_load_weights_plans_the_pairs_of_a_mapping_and_sends_host_copies():
    """A state dict (a mapping) is its items: rank 0 plans the same pairs it sends, each a
    detached host tensor."""
    tp = FakeGroup(FakeConn(PLANNED))
    runner = _runner(tp)
    weight = torch.ones(2, requires_grad=True)
    assert runner.load_weights({"a": weight, "b": torch.zeros(3)}) == 7
    ((kind, pairs),) = runner.plans
    assert kind == "load" and [n for n, _ in pairs] == ["a", "b"]
    ((message, load, sent),) = tp.pickled
    assert (message, load, [n for n, _ in sent]) == ("plan_weights", "load", ["a", "b"])
    assert not sent[0][1].requires_grad and sent[0][1].device.type == "cpu"
    assert torch.equal(sent[1][1], torch.zeros(3))


class CheckpointLike(ValueError):
    """A ValueError subclass (as loader.CheckpointError is)."""


@pytest.mark.parametrize(
    "error, answer",
    [
        (ValueError("bad shape"), ("ValueError", "bad shape")),
        (CheckpointLike("bad file"), ("ValueError", "bad file")),  # rank 0 raises a ValueError
        (RuntimeError("weights asleep"), ("RuntimeError", "weights asleep")),
        (OSError("no such file"), ("OSError", "no such file")),
    ],
)
def test_a_workers_refusal_is_its_type_and_message_and_nothing_is_kept(error, answer):
    def plan(kind, source):
        if kind == "reload":
            raise error
        return "update"

    runner = _runner(None, plan)
    assert runner.answer_plan("load", []) is None and runner._planned == "update"
    assert runner.answer_plan("reload", "/ckpt") == answer
    assert runner._planned is None  # a refused plan replaces the earlier one: nothing to commit
    runner.commit_plan(True)
    assert runner.committed == []


def test_a_worker_applies_its_plan_only_when_told_and_only_once():
    runner = _runner(None, lambda kind, source: ("update", source))
    assert runner.answer_plan("reload", "/a") is None
    runner.commit_plan(False)
    runner.commit_plan(True)  # dropped: nothing planned any more
    assert runner.committed == []
    assert runner.answer_plan("reload", "/b") is None
    runner.commit_plan(True)
    runner.commit_plan(True)
    assert runner.committed == [("update", "/b")] and runner._planned is None


def test_send_pickled_sends_the_tensors_by_value_and_leaves_the_callers_in_place():
    """TensorParallel.send_pickled: every worker's pipe gets the message (its tensors equal),
    pickled once by value; the caller's tensors stay in private memory (Pipe.send would have
    moved their storages into shared memory, /dev/shm, which may be small)."""
    import multiprocessing
    from types import SimpleNamespace

    from enginespec.worker.tp_group import TensorParallel

    pipes = [multiprocessing.Pipe() for _ in range(2)]
    group = SimpleNamespace(conns=[a for a, _ in pipes], check_alive=lambda: None, dead_error=EngineDeadError)
    group._to_each = lambda write: TensorParallel._to_each(group, write)
    weight = torch.arange(6.0).reshape(2, 3)
    TensorParallel.send_pickled(group, ("plan_weights", "load", [("w", weight)]))
    for _, worker_end in pipes:
        kind, load, ((name, got),) = worker_end.recv()
        assert (kind, load, name) == ("plan_weights", "load", "w") and torch.equal(got, weight)
    assert not weight.is_shared()
