"""TK301 and TK302 inside a same-file function that a training loop calls on every iteration.

The PyTorch char-RNN tutorial's ``train(category_tensor, line_tensor)`` ends in ``return output,
loss.item()`` and is called by ``for iter in range(...)``; a Trainer class's ``fit()`` calls
``self.train_step(batch)``. The read runs on every step all the same, so it is reported at its
line in the function. Each no-report case also checks the variant without its guard is reported,
so that the guard, not a blind spot, is what keeps it quiet.
"""
from __future__ import annotations

import textwrap
from typing import List, Tuple

from trainkit.lint import lint_source


def _pairs(source: str) -> List[Tuple[str, int]]:
    return sorted((f.code, f.line) for f in lint_source(textwrap.dedent(source), select="TK3"))


def _messages(source: str) -> List[str]:
    return [f.message for f in lint_source(textwrap.dedent(source), select="TK3")]


BRIEF = """
import torch
def train_step(model, batch, optimizer):
    loss = criterion(model(batch[0]), batch[1])
    loss.backward(); optimizer.step(); optimizer.zero_grad()
    torch.cuda.empty_cache()
    return loss.item()
for epoch in range(10):
    for batch in loader:
        loss = train_step(model, batch, optimizer)
"""


def test_a_step_function_called_at_every_batch_is_read() -> None:
    assert _pairs(BRIEF) == [("TK301", 6), ("TK302", 7)]


def test_the_message_says_which_loop_calls_it() -> None:
    messages = _messages(BRIEF)
    assert len(messages) == 2
    for message in messages:
        assert "in `train_step()`, which runs on every step because the training loop on line 9 calls it on line 10" \
            in message, message


# PyTorch's "NLP From Scratch: Classifying Names with a Character-Level RNN", in our own words.
CHAR_RNN = """
import torch
import torch.nn as nn
criterion = nn.NLLLoss()
learning_rate = 0.005

def train(category_tensor, line_tensor):
    hidden = rnn.initHidden()
    rnn.zero_grad()
    for i in range(line_tensor.size()[0]):
        output, hidden = rnn(line_tensor[i], hidden)
    loss = criterion(output, category_tensor)
    loss.backward()
    for p in rnn.parameters():
        p.data.add_(p.grad.data, alpha=-learning_rate)
    return output, loss.item()

current_loss = 0
for iter in range(1, n_iters + 1):
    category, line, category_tensor, line_tensor = randomTrainingExample()
    output, loss = train(category_tensor, line_tensor)
    current_loss += loss
    if iter % print_every == 0:
        print('%d %.4f' % (iter, loss))
"""


def test_the_char_rnn_tutorial() -> None:
    assert _pairs(CHAR_RNN) == [("TK302", 16)]


TRAINER = """
import gc
import torch

class Trainer:
    def __init__(self, model, loader, optimizer):
        self.model, self.loader, self.optimizer = model, loader, optimizer

    def train_step(self, batch):
        x, y = batch
        self.optimizer.zero_grad()
        loss = self.model(x, y)
        loss.backward()
        self.optimizer.step()
        gc.collect()
        self.history.append(loss.item())
        return float(loss)

    def fit(self, epochs):
        for epoch in range(epochs):
            for batch in self.loader:
                self.train_step(batch)
"""


def test_a_method_of_the_same_class_is_read() -> None:
    assert _pairs(TRAINER) == [("TK301", 15), ("TK302", 16), ("TK302", 17)]


def test_a_method_of_another_object_or_class_is_not_read() -> None:
    assert _pairs(TRAINER) != []  # the same class's method is read
    other = TRAINER.replace("                self.train_step(batch)", "                self.helper.train_step(batch)")
    assert other != TRAINER and _pairs(other) == []
    other = TRAINER.replace("    def fit(self, epochs):", "class Runner:\n    def fit(self, epochs):")
    assert other != TRAINER and _pairs(other) == []


def test_a_function_called_only_under_a_modulo_test_is_not_reported() -> None:
    src = """
    import torch
    def log_metrics(loss, step):
        torch.cuda.empty_cache()
        print(f"step {step}: {loss.item():.3f}")
    for step, (x, y) in enumerate(loader):
        loss = model(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step % 100 == 0:
            log_metrics(loss, step)
    """
    assert _pairs(src) == []
    unguarded = src.replace("        if step % 100 == 0:\n            log_metrics", "        log_metrics")
    assert _pairs(unguarded) == [("TK301", 4), ("TK302", 5)]


def test_a_function_called_behind_an_early_exit_on_a_modulo_test_is_not_reported() -> None:
    src = """
    def log_metrics(loss):
        print(loss.item())
    for step, (x, y) in enumerate(loader):
        loss = model(x, y)
        loss.backward()
        optimizer.step()
        if step % 100 != 0:
            continue
        log_metrics(loss)
    """
    assert _pairs(src) == []
    assert _pairs(src.replace("if step % 100 != 0:\n            continue", "pass")) == [("TK302", 3)]


def test_a_function_called_from_eval_code_is_not_reported() -> None:
    src = """
    import torch
    def evaluate_batch(model, x, y):
        return criterion(model(x), y).item()

    def train(model, loader, val_loader, optimizer):
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            with torch.no_grad():
                seen = evaluate_batch(model, x, y)
        model.eval()
        with torch.no_grad():
            total = sum(evaluate_batch(model, x, y) for x, y in val_loader)
        for x, y in val_loader:
            total += evaluate_batch(model, x, y)
    """
    assert _pairs(src) == []
    no_guard = src.replace("            with torch.no_grad():\n                seen =", "            seen =")
    assert no_guard != src and _pairs(no_guard) == [("TK302", 4)]


def test_a_decorated_function_is_not_read() -> None:
    # `@torch.no_grad()` makes it eval code; any decorator may change what runs
    src = """
    import torch
    @torch.no_grad()
    def ema_loss(model, x, y):
        return criterion(model(x), y).item()
    for x, y in loader:
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        seen = ema_loss(model, x, y)
    """
    assert _pairs(src) == []
    assert _pairs(src.replace("    @torch.no_grad()\n", "    # no decorator\n")) == [("TK302", 5)]


def test_reads_under_the_functions_own_condition_are_not_reported() -> None:
    src = """
    import gc
    def train_step(step, batch):
        loss = model(*batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step % 1000 == 0:
            gc.collect()
        if step % log_every == 0:
            print(loss.item())
        if step % 10 != 0:
            return
        print(float(loss))

    for step, batch in enumerate(loader):
        train_step(step, batch)
    """
    assert _pairs(src) == []
    bare = src.replace("        if step % 1000 == 0:\n            gc", "        pass\n        gc")
    bare = bare.replace("        if step % log_every == 0:\n            print", "        pass\n        print")
    bare = bare.replace("        if step % 10 != 0:\n            return", "        pass\n        pass")
    assert bare.count("pass") == 4
    assert _pairs(bare) == [("TK301", 9), ("TK302", 11), ("TK302", 14)]


def test_a_function_called_from_two_loops_is_reported_once_per_line() -> None:
    src = """
    import torch
    def train_step(batch):
        loss = model(*batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        torch.cuda.empty_cache()
        return loss.item()

    for batch in warmup_loader:
        train_step(batch)
    for epoch in range(10):
        for batch in loader:
            train_step(batch)
            train_step(batch)
    """
    assert _pairs(src) == [("TK301", 8), ("TK302", 9)]
    assert all("the training loop on line 11 calls it on line 12" in m for m in _messages(src))


def test_one_level_only() -> None:
    src = """
    def log_loss(loss):
        print(loss.item())
    def train_step(batch):
        loss = model(*batch)
        loss.backward()
        optimizer.step()
        log_loss(loss)
    for batch in loader:
        train_step(batch)
    """
    assert _pairs(src) == []
    # called from the loop itself, the helper is read
    assert _pairs(src.replace("        train_step(batch)", "        log_loss(train_step(batch))")) == [("TK302", 3)]


def test_recursion_is_not_followed() -> None:
    src = """
    def train(model, loader, depth):
        for batch in loader:
            loss = model(*batch)
            loss.backward()
            optimizer.step()
            train(model, loader, depth - 1)
        print(loss.item())
    """
    assert _pairs(src) == []
    # the loop's own read is still reported
    assert _pairs(src.replace("        print(loss.item())", "            print(loss.item())")) == [("TK302", 8)]


def test_a_shadowed_or_rebound_name_is_not_followed() -> None:
    src = """
    def train_step(batch):
        loss = model(*batch)
        loss.backward()
        optimizer.step()
        return loss.item()
    def fit(train_step, loader):
        for batch in loader:
            train_step(batch)
    """
    assert _pairs(src) == []
    assert _pairs(src.replace("def fit(train_step, loader):", "def fit(step, loader):")) == [("TK302", 6)]
    compiled = src.replace("    def fit(train_step, loader):",
                           "    train_step = torch.compile(train_step)\n    def fit(loader):")
    assert compiled != src and _pairs(compiled) == []
    # nothing imported is followed, and an import of the name hides the `def`
    imported = src.replace("    def fit(train_step, loader):", "    from helpers import train_step\n    def fit(loader):")
    assert imported != src and _pairs(imported) == []


def test_a_value_the_environment_needs_is_not_reported() -> None:
    # PyTorch's examples/reinforcement_learning/reinforce.py: select_action returns `action.item()`
    # for env.step, and finish_episode() (backward and step) makes the episode loop a training loop
    src = """
    import torch
    from torch.distributions import Categorical
    def select_action(state):
        probs = policy(torch.from_numpy(state).float().unsqueeze(0))
        m = Categorical(probs)
        action = m.sample()
        policy.saved_log_probs.append(m.log_prob(action))
        return action.item()

    def finish_episode():
        optimizer.zero_grad()
        policy_loss = torch.cat(policy.losses).sum()
        policy_loss.backward()
        optimizer.step()

    for i_episode in count(1):
        state, _ = env.reset()
        for t in range(1, 10000):
            action = select_action(state)
            state, reward, done, _, _ = env.step(action)
            if done:
                break
        finish_episode()
    """
    assert _pairs(src) == []
    logged = src.replace("            action = select_action(state)", "            log(select_action(state))")
    assert _pairs(logged) == [("TK302", 9)]


def test_an_epoch_function_is_not_read() -> None:
    # a function holding the batch loop is a whole epoch: its reads after that loop run once per epoch
    src = """
    import gc
    def train_epoch(loader):
        total = 0.0
        for x, y in loader:
            loss = model(x, y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            total += loss.detach()
        gc.collect()
        return total.item()

    for epoch in range(10):
        loss = model(*next(extra))
        loss.backward()
        optimizer.step()
        train_epoch(loader)
    """
    assert _pairs(src) == []
    step = src.replace("for x, y in loader:", "if True:")
    assert _pairs(step) == [("TK301", 11), ("TK302", 12)]


def test_a_training_loop_inside_the_function_is_reported_once_by_itself() -> None:
    # the micro-batch loop is a training loop of its own: its `.item()` is reported there, once;
    # what runs after it, once per call, is reported through the call
    src = """
    import torch
    def train_step(batch):
        for micro in batch.chunk(4):
            loss = model(micro) / 4
            loss.backward()
            print(loss.item())
        optimizer.step()
        optimizer.zero_grad()
        torch.cuda.empty_cache()

    for batch in loader:
        train_step(batch)
    """
    assert _pairs(src) == [("TK301", 10), ("TK302", 7)]
    messages = {f.line: f.message for f in lint_source(textwrap.dedent(src), select="TK3")}
    assert "`train_step()`" not in messages[7] and "`train_step()`" in messages[10]


def test_an_epoch_method_stepping_through_a_step_method_is_not_read() -> None:
    # `_run_epoch` holds the batch loop, which steps through `self._run_batch`: what follows it runs
    # once per epoch, even where the epoch loop is a training loop (it steps a last window itself)
    src = """
    import gc
    class Trainer:
        def _run_batch(self, x, y):
            self.optimizer.zero_grad()
            loss = self.model(x, y)
            loss.backward()
            self.optimizer.step()

        def _run_epoch(self, epoch):
            for x, y in self.train_data:
                self._run_batch(x, y)
            gc.collect()
            return self.total.item()

        def train(self, max_epochs):
            for epoch in range(max_epochs):
                self._run_epoch(epoch)
                self.model(*self.last).backward()
                self.optimizer.step()
    """
    assert _pairs(src) == []
    one_batch = src.replace("            for x, y in self.train_data:\n                self._run_batch(x, y)",
                            "            if True:\n                self._run_batch(x, y)")
    assert one_batch != src and _pairs(one_batch) == [("TK301", 13), ("TK302", 14)]
