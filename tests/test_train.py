import pytest
import torch

from course_utils.train import CheckpointEvery, EarlyStopping, EvalEvery, TrainState, fit


def make_problem(seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(64, 3, generator=g)
    y = x @ torch.tensor([1.0, -2.0, 0.5])
    w = torch.zeros(3, requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.1)

    def step(batch):
        xb, yb = batch
        opt.zero_grad()
        loss = ((xb @ w - yb) ** 2).mean()
        loss.backward()
        opt.step()
        return loss

    def batches(epoch):
        order = torch.randperm(64, generator=torch.Generator().manual_seed(epoch))
        return [(x[order[i:i + 16]], y[order[i:i + 16]]) for i in range(0, 64, 16)]
    return w, step, batches


def test_loss_falls_and_counts_steps():
    w, step, batches = make_problem()
    hist = fit(step, batches, epochs=5, progress=False)
    losses = hist.series("loss")
    assert len(losses) == 20
    assert losses[-1] < 0.1 * losses[0]


def test_steps_limit_and_resume_is_exact():
    w, step, batches = make_problem()
    fit(step, batches, steps=10, progress=False)
    straight = w.detach().clone()

    w2, step2, batches2 = make_problem()
    state = TrainState()
    fit(step2, batches2, steps=6, state=state, progress=False)
    assert state.position() == {"step": 6, "epoch": 1, "batch_index": 2}
    fit(step2, batches2, steps=10, state=state, progress=False)
    assert torch.equal(w2.detach(), straight)
    assert len(state.history.records) == 10


def test_eval_and_early_stopping():
    w, step, batches = make_problem()
    values = iter([0.5, 0.6, 0.55, 0.58, 0.59, 0.9])
    stopper = EarlyStopping("acc", patience=3)
    saves = []
    hist = fit(step, batches, steps=100, progress=False,
               callbacks=[EvalEvery(2, lambda: {"acc": next(values)}, at_end=False), stopper,
                          CheckpointEvery(4, lambda s: saves.append(s.step))])
    assert stopper.best == 0.6 and stopper.best_step == 4
    assert hist.records[-1]["step"] == 10  # evals at 2,4,6,8,10: three without improvement
    assert saves == [4, 8]
    assert hist.as_dict()["eval_acc"] == [0.5, 0.6, 0.55, 0.58, 0.59]


def test_evaluations_stop_after_until_the_end_included():
    w, step, batches = make_problem()
    hist = fit(step, batches, steps=10, callbacks=[EvalEvery(3, lambda: {"w0": w[0].item()}, until=6)],
               progress=False)
    assert [e["step"] for e in hist.evals] == [3, 6]
    with pytest.raises(ValueError, match="until"):
        EvalEvery(3, lambda: {}, until=0)


def test_bad_arguments():
    w, step, batches = make_problem()
    with pytest.raises(ValueError, match="steps="):
        fit(step, batches)
    with pytest.raises(ValueError, match="non-negative"):
        fit(step, batches, steps=-1)
    with pytest.raises(ValueError, match="no batches"):
        fit(step, lambda e: [], epochs=1, progress=False)
    with pytest.raises(ValueError, match="loss"):
        fit(lambda b: {"acc": 1.0}, batches, steps=1, progress=False)
    with pytest.raises(ValueError):
        EarlyStopping("acc", mode="up")


def test_early_stopping_state_round_trip():
    model = torch.nn.Linear(2, 1)
    a = EarlyStopping("acc", patience=2, model=model)
    a.best, a.best_step, a.bad_evals, a._seen = 0.7, 8, 1, 4
    b = EarlyStopping("acc", patience=2, model=model)
    b.load_state_dict(a.state_dict())
    assert (b.best, b.best_step, b.bad_evals, b._seen) == (0.7, 8, 1, 4)
    with pytest.raises(ValueError, match="missing"):
        b.load_state_dict({})


class Counter(torch.nn.Module):
    """One weight that each step increases by 1: the weights say which step they belong to."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(()))

    def step(self, batch):
        with torch.no_grad():
            self.w += 1
        return 0.0


def test_final_evaluation_at_train_end_counts_for_early_stopping():
    # Evaluations at steps 4 and 8 during training, and at 10 when training ends; the metric
    # rises, so the final evaluation is the best and its weights (w = 10) must be the ones kept.
    m = Counter()
    stopper = EarlyStopping("acc", patience=3, model=m)
    hist = fit(m.step, [None], steps=10, progress=False,
               callbacks=[EvalEvery(4, lambda: {"acc": m.w.item()}), stopper])
    assert hist.series("step", evals=True) == [4, 8, 10]
    assert (stopper.best, stopper.best_step) == (10.0, 10)
    assert m.w.item() == 10.0


@pytest.mark.parametrize("order", ["evaluator first", "stopper first"])
def test_early_stopping_keeps_the_weights_that_were_evaluated(order):
    # The metric peaks at w = 5 (evaluated at step 5); whatever the callbacks' order, the weights
    # restored are those of step 5, not of the step after the evaluation.
    m = Counter()
    evaluator = EvalEvery(5, lambda: {"acc": -abs(m.w.item() - 5)}, at_end=False)
    stopper = EarlyStopping("acc", patience=2, model=m)
    callbacks = [evaluator, stopper] if order == "evaluator first" else [stopper, evaluator]
    hist = fit(m.step, [None], steps=100, progress=False, callbacks=callbacks)
    assert hist.series("step", evals=True) == [5, 10, 15]   # two evaluations without improvement
    assert hist.last("step") == 15 and stopper.best_step == 5
    assert m.w.item() == 5.0
