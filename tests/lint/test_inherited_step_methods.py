"""``self.training_step(batch)`` resolved to a method inherited from a base class of the same file.

A Trainer base class defines ``training_step``; a subclass's ``fit()`` calls it every batch. The
method is looked up along the method resolution order of the file's own classes, and the lookup
stops (nothing is read) at a base the file does not define once, plainly.
"""
from __future__ import annotations

import textwrap
from typing import List, Tuple

from trainkit.lint import lint_source


def _pairs(source: str) -> List[Tuple[str, int]]:
    return sorted((f.code, f.line) for f in lint_source(textwrap.dedent(source), select="TK3"))


BASE = """
import torch

class Trainer:
    def training_step(self, batch):
        loss = self.model(*batch)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        torch.cuda.empty_cache()
        return loss.item()

class MyTrainer(Trainer):
    def fit(self, loader):
        for batch in loader:
            self.training_step(batch)
"""
FOUND = [("TK301", 10), ("TK302", 11)]


def test_an_inherited_method_is_read() -> None:
    assert _pairs(BASE) == FOUND
    messages = [f.message for f in lint_source(textwrap.dedent(BASE), select="TK3")]
    assert all("in `training_step()`, which runs on every step because the training loop on line 15 calls it on "
               "line 16" in m for m in messages), messages


def test_two_levels_up_and_a_base_first_in_the_mro() -> None:
    src = BASE.replace("class MyTrainer(Trainer):", "class Middle(Trainer):\n    pass\n\nclass MyTrainer(Middle):")
    assert src != BASE and _pairs(src) == FOUND
    src = BASE.replace("class MyTrainer(Trainer):", "class LogMixin:\n    def log(self):\n        pass\n\n"
                                                    "class MyTrainer(LogMixin, Trainer):")
    assert src != BASE and _pairs(src) == FOUND
    # an unknown base after the one defining the method does not hide it
    src = BASE.replace("class MyTrainer(Trainer):", "class MyTrainer(Trainer, nn.Module):")
    assert _pairs(src) == FOUND


def test_an_override_in_between_wins() -> None:
    src = BASE.replace("class MyTrainer(Trainer):", "class Middle(Trainer):\n    def training_step(self, batch):\n"
                                                    "        self.run(batch).backward()\n        self.optimizer.step()\n"
                                                    "        gc.collect()\n\n"
                                                    "class MyTrainer(Middle):")
    # the override's own flush is read, at its line; the base's reads are not
    assert src != BASE and _pairs(src.replace("import torch", "import gc, torch")) == [("TK301", 17)]
    # a mixin listed first that overrides it wins too
    src = BASE.replace("class MyTrainer(Trainer):", "class Mixin:\n    def training_step(self, batch):\n"
                                                    "        self.run(batch).backward()\n\n"
                                                    "class MyTrainer(Mixin, Trainer):")
    assert src != BASE and _pairs(src) == []
    # so does a plain attribute of a class in between
    src = BASE.replace("class MyTrainer(Trainer):", "class Middle(Trainer):\n    training_step = None\n\n"
                                                    "class MyTrainer(Middle):")
    assert src != BASE and _pairs(src) == []


def test_the_lookup_stops_at_a_base_the_file_does_not_define_once() -> None:
    # an unknown base ahead of the one defining the method may define it too
    src = BASE.replace("class MyTrainer(Trainer):", "class MyTrainer(lightning.LightningModule, Trainer):")
    assert src != BASE and _pairs(src) == []
    src = BASE.replace("class MyTrainer(Trainer):", "class Middle(base.Trainer):\n    pass\n\nclass MyTrainer(Middle, Trainer):")
    assert src != BASE and _pairs(src) == []
    # imported, or defined twice
    assert _pairs(BASE.replace("class Trainer:", "from lib import Trainer\nclass Other:")) == []
    twice = BASE.replace("class MyTrainer(Trainer):", "class Trainer:\n    pass\n\nclass MyTrainer(Trainer):")
    assert twice != BASE and _pairs(twice) == []
    rebound = BASE.replace("class MyTrainer(Trainer):", "Trainer = make_trainer(Trainer)\nclass MyTrainer(Trainer):")
    assert rebound != BASE and _pairs(rebound) == []
    # a decorated base class may be replaced by its decorator
    assert _pairs(BASE.replace("class Trainer:", "@register\nclass Trainer:")) == []


def test_an_inherited_decorated_method_is_not_read() -> None:
    src = BASE.replace("    def training_step(self, batch):", "    @torch.no_grad()\n    def training_step(self, batch):")
    assert src != BASE and _pairs(src) == []
