"""The one training loop every lesson uses.

``fit(step_fn, batches, steps=..., epochs=...)`` calls ``step_fn(batch)`` for each batch, where
``step_fn`` does forward, backward and the optimizer update and returns the loss (a float or a
0-d tensor) or a dict of metrics that contains ``"loss"``. Everything else — evaluation, early
stopping, checkpoints — is a callback, so lessons differ only in their step function.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm

from . import checks


@dataclass
class History:
    """Per-step metrics (``records``) and evaluation results (``evals``), each a list of dicts."""
    records: list = field(default_factory=list)
    evals: list = field(default_factory=list)

    def series(self, key: str, *, evals: bool = False) -> list:
        rows = self.evals if evals else self.records
        return [r[key] for r in rows if key in r]

    def last(self, key: str, *, evals: bool = False):
        values = self.series(key, evals=evals)
        if not values:
            raise KeyError(f"no {'eval' if evals else 'step'} metric {key!r} recorded yet")
        return values[-1]

    def as_dict(self) -> dict:
        out: dict = {}
        for r in self.records:
            for k, v in r.items():
                out.setdefault(k, []).append(v)
        for r in self.evals:
            for k, v in r.items():
                if k != "step":
                    out.setdefault(f"eval_{k}", []).append(v)
            out.setdefault("eval_step", []).append(r["step"])
        return out

    def state_dict(self) -> dict:
        return {"records": copy.deepcopy(self.records), "evals": copy.deepcopy(self.evals)}

    @classmethod
    def from_state_dict(cls, state: dict) -> "History":
        return cls(records=copy.deepcopy(state["records"]), evals=copy.deepcopy(state["evals"]))


@dataclass
class TrainState:
    """Where the loop is: ``step`` counts completed updates; ``batch_index`` is within ``epoch``."""
    step: int = 0
    epoch: int = 0
    batch_index: int = 0
    history: History = field(default_factory=History)
    stop: bool = False
    stop_reason: str = ""
    callbacks: list = field(default_factory=list, repr=False, compare=False)  # set by fit

    def position(self) -> dict:
        return {"step": self.step, "epoch": self.epoch, "batch_index": self.batch_index}


class Callback:
    """Hooks the loop calls. ``state_dict``/``load_state_dict`` let a checkpoint carry a
    callback's own counters, so that a resumed run stops and evaluates exactly where the
    uninterrupted one would."""
    _state_keys: tuple = ()

    def on_step_end(self, state: TrainState) -> None: ...
    def on_epoch_end(self, state: TrainState) -> None: ...
    def on_evaluation(self, state: TrainState, record: dict) -> None:
        """An evaluation was just recorded (``record`` is in ``state.history.evals``), by
        ``EvalEvery`` during a step or at the end of training, before the weights change again."""
    def on_train_end(self, state: TrainState) -> None:
        """Training stopped; last chance to add to the history (a final evaluation)."""
    def on_fit_end(self, state: TrainState) -> None:
        """After every callback's ``on_train_end``: the history is final (restore weights here)."""

    def state_dict(self) -> dict:
        return {k: copy.deepcopy(getattr(self, k)) for k in self._state_keys}

    def load_state_dict(self, state: dict) -> None:
        missing = set(self._state_keys) - set(state)
        if missing:
            raise ValueError(f"{type(self).__name__} state is missing {sorted(missing)}")
        for k in self._state_keys:
            setattr(self, k, copy.deepcopy(state[k]))


class EvalEvery(Callback):
    """Every ``every`` steps (and at the end), call ``evaluate()`` -> dict and record it; with
    ``until``, at no step after it (the end included)."""
    _state_keys = ("_last",)

    def __init__(self, every: int, evaluate, *, at_end: bool = True, until: int | None = None):
        checks.positive_int(every, "every")
        if until is not None:
            checks.positive_int(until, "until")
        self.every, self.evaluate, self.at_end, self.until = every, evaluate, at_end, until
        self._last = None

    def _run(self, state):
        if self._last == state.step or (self.until is not None and state.step > self.until):
            return
        result = self.evaluate()
        if not isinstance(result, dict):
            raise TypeError("evaluate() must return a dict of metrics, e.g. {'probe_acc': 0.7}")
        record = {"step": state.step, **{k: float(v) for k, v in result.items()}}
        state.history.evals.append(record)
        self._last = state.step
        for cb in state.callbacks:  # e.g. EarlyStopping: judge (and copy) these very weights
            cb.on_evaluation(state, record)

    def on_step_end(self, state):
        if state.step % self.every == 0:
            self._run(state)

    def on_train_end(self, state):
        if self.at_end:
            self._run(state)


class EarlyStopping(Callback):
    """Stop when eval metric ``metric`` has not improved by ``min_delta`` for ``patience`` evals.

    With ``model`` given, the best weights are kept and restored when training ends. Every
    evaluation counts, the final one ``EvalEvery`` adds at the end of training included, and the
    weights kept are the ones that were evaluated (``on_evaluation`` runs right after each
    evaluation, whatever the order of the callbacks). Evaluations appended to the history by other
    means are picked up after the step that added them.
    """
    _state_keys = ("best", "best_step", "best_state", "bad_evals", "_seen")

    def __init__(self, metric: str, *, mode: str = "max", patience: int = 3,
                 min_delta: float = 0.0, model: torch.nn.Module | None = None):
        checks.choice(mode, "mode", ("max", "min"))
        checks.positive_int(patience, "patience")
        self.metric, self.mode, self.patience, self.min_delta, self.model = metric, mode, patience, min_delta, model
        self.best = -math.inf if mode == "max" else math.inf
        self.best_step = None
        self.best_state = None
        self.bad_evals = 0
        self._seen = 0

    def _improved(self, value):
        return value > self.best + self.min_delta if self.mode == "max" else value < self.best - self.min_delta

    def _consume(self, state):
        """Judge every evaluation not seen yet, in order."""
        evals = [e for e in state.history.evals if self.metric in e]
        for e in evals[self._seen:]:
            if self._improved(e[self.metric]):
                self.best, self.best_step, self.bad_evals = e[self.metric], e["step"], 0
                if self.model is not None:
                    self.best_state = copy.deepcopy(self.model.state_dict())
            else:
                self.bad_evals += 1
        self._seen = len(evals)
        if self.bad_evals >= self.patience and not state.stop:
            state.stop = True
            state.stop_reason = (f"early stop: {self.metric} did not improve for {self.patience} "
                                 f"evaluations (best {self.best:.4g} at step {self.best_step})")

    def on_evaluation(self, state, record):
        self._consume(state)

    def on_step_end(self, state):
        self._consume(state)

    def on_fit_end(self, state):
        self._consume(state)  # the final evaluation too, before choosing the weights to keep
        if self.model is not None and self.best_state is not None:
            self.model.load_state_dict(self.best_state)


class CheckpointEvery(Callback):
    """Every ``every`` steps call ``save(state)``, e.g. a CheckpointManager's save."""

    def __init__(self, every: int, save):
        checks.positive_int(every, "every")
        self.every, self.save = every, save

    def on_step_end(self, state):
        if state.step % self.every == 0:
            self.save(state)


def _metrics(out) -> dict:
    if isinstance(out, dict):
        if "loss" not in out:
            raise ValueError("step_fn returned a dict without 'loss'")
        return {k: (v.item() if torch.is_tensor(v) else float(v)) for k, v in out.items()}
    return {"loss": out.item() if torch.is_tensor(out) else float(out)}


def fit(step_fn, batches, *, steps: int | None = None, epochs: int | None = None,
        callbacks=(), state: TrainState | None = None, desc: str = "train",
        progress: bool = True) -> History:
    """Train until ``steps`` updates or ``epochs`` passes over the data, whichever comes first.

    ``batches`` is a function ``epoch -> iterable of batches``, normally the one batch source
    ``dataset.batches(B, seed=...)`` (``course_utils.batches.Batches``: reshuffled per epoch from
    its seed, which is what makes an exact resume possible), or a re-iterable such as a list. Pass ``state`` from a
    checkpoint to resume: the loop skips the ``batch_index`` batches already used in that epoch.
    Returns the run's ``History``; ``state`` (if given) is updated in place.
    """
    if steps is None and epochs is None:
        raise ValueError("give steps= (number of updates) or epochs= (passes over the data), or both")
    for name, v in (("steps", steps), ("epochs", epochs)):
        if v is not None:
            checks.positive_int(v, name, minimum=0)
    if not callable(step_fn):
        raise TypeError("step_fn must be a callable taking one batch")
    epoch_batches = batches if callable(batches) else (lambda _epoch: batches)
    state = state if state is not None else TrainState()
    state.callbacks = list(callbacks)

    total = steps if steps is not None else None
    bar = tqdm(total=total, initial=state.step, desc=desc, disable=not progress, leave=False)
    try:
        while not state.stop and (epochs is None or state.epoch < epochs):
            if steps is not None and state.step >= steps:
                break
            for i, batch in enumerate(epoch_batches(state.epoch)):
                if i < state.batch_index:
                    continue  # resumed mid-epoch: these batches were already used
                metrics = _metrics(step_fn(batch))
                state.step += 1
                state.batch_index = i + 1
                state.history.records.append({"step": state.step, "epoch": state.epoch, **metrics})
                bar.update(1)
                # refresh=False: shown at the bar's next timed redraw; a redraw per step costs a
                # notebook a widget message per step (several ms on steps of tens of ms)
                bar.set_postfix(loss=f"{metrics['loss']:.4f}", refresh=False)
                for cb in callbacks:
                    cb.on_step_end(state)
                if state.stop or (steps is not None and state.step >= steps):
                    break
            else:
                if state.batch_index == 0:
                    raise ValueError(f"epoch {state.epoch} yielded no batches: is the dataset "
                                     "smaller than one batch (drop_last=True)?")
                state.epoch += 1
                state.batch_index = 0
                for cb in callbacks:
                    cb.on_epoch_end(state)
                continue
            break
    finally:
        bar.close()
    for cb in callbacks:
        cb.on_train_end(state)
    for cb in callbacks:
        cb.on_fit_end(state)
    return state.history

