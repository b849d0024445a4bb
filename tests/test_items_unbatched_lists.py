"""ItemsCounter on a batch that holds a list of tensors: unbatched samples (variable-size images
from ``tuple(zip(*b))`` or a custom collate, each (3, H, W)) count by the list's length, a
multi-crop's batched views (each (B, 3, H, W)) by their first dimension. The images were counted
as 3 items, their channels."""
from __future__ import annotations

import time

import torch

import trainkit as tk
from tests.conftest import scalars
from tests.helpers import items_per_step
from trainkit._items import ItemsCounter


def _img(h: int = 5, w: int = 5) -> torch.Tensor:
    return torch.zeros(3, h, w)


def _images(n: int) -> list:
    return [_img(4 + i % 3, 6 - i % 2) for i in range(n)]  # variable sizes, as such lists have


def test_a_list_of_images_beside_labels_counts_the_images():
    count = ItemsCounter()
    assert count((_images(8), torch.zeros(8))) == 8
    # Counted by the labels from then on (an index and a type check), never read inline as
    # batch[0].shape[0] (the list's), by the patched loader.
    assert count.path == [1] and not count.first
    assert count((_images(5), torch.zeros(5))) == 5
    assert count([[_img()] * 8, torch.zeros(8, dtype=torch.long)]) == 8  # same-size images too
    assert ItemsCounter()({"images": _images(6), "labels": torch.zeros(6)}) == 6
    assert ItemsCounter()(([_img()], torch.zeros(1))) == 1


def test_a_first_batch_as_long_as_its_channels_is_read_as_either():
    # 3 images of 3 channels beside 3 labels: the labels count, which is right either way, and
    # the next batches, of 8, are 8 (the list's first tensor's first dimension was 3 again).
    count = ItemsCounter()
    assert [count((_images(n), torch.zeros(n))) for n in (3, 8, 2)] == [3, 8, 2]
    assert not count.first


def test_a_multi_crop_batch_still_counts_its_batch():
    count = ItemsCounter()
    for b in (4, 6):
        assert count(([torch.zeros(b, 3, 8, 8), torch.zeros(b, 3, 8, 8)], torch.zeros(b))) == b
    assert count.path == [0, 0] and not count.first
    # DINO's: 2 global crops and 6 local ones of another size, all (B, ...).
    dino = [torch.zeros(4, 3, 8, 8)] * 2 + [torch.zeros(4, 3, 4, 4)] * 6
    assert ItemsCounter()((dino, torch.zeros(4))) == 4
    # iBOT's: crops, labels, a mask per crop.
    assert ItemsCounter()((dino, torch.zeros(4), [torch.zeros(4, 2, 2)] * 8)) == 4
    # RotNet's: 4 rotations of the batch and a (B,) rotation label per rotation, no other tensor.
    count = ItemsCounter()
    assert count(([torch.zeros(5, 3, 4, 4)] * 4, [torch.zeros(5)] * 4)) == 5
    assert count(([torch.zeros(2, 3, 4, 4)] * 4, [torch.zeros(2)] * 4)) == 2


def test_the_columns_of_zip_with_int_labels_count_the_images():
    # torchvision's ImageFolder gives (image, int): tuple(zip(*b)) is (images, ints), no tensor
    # beside the images; the ints, as long as them, tell that they are samples.
    count = ItemsCounter()
    assert count((tuple(_images(8)), tuple(range(8)))) == 8
    assert count.records == [0] and not count.first
    assert count((tuple(_images(3)), (0, 1, 2))) == 3
    assert ItemsCounter()({"images": [_img()] * 4, "paths": ["a", "b", "c", "d"]}) == 4
    # Per-sample targets of their own sizes: boxes, (K_i, 4), beside the images.
    boxes = [torch.zeros(i % 3 + 1, 4) for i in range(7)]
    assert ItemsCounter()((_images(7), boxes)) == 7


def test_tensors_of_different_first_dimensions_are_samples():
    # Variable-length sequences, (T_i, D), not padded: the views of one batch share theirs.
    count = ItemsCounter()
    assert count({"seqs": [torch.zeros(t, 4) for t in (2, 5, 3)]}) == 3
    assert count({"seqs": [torch.zeros(t, 4) for t in (1, 1, 1, 1, 1)]}) == 5  # by the length
    assert not count.first


def test_with_nothing_to_tell_the_first_tensor_counts_as_before():
    # A list of same-shaped tensors alone is as much a batch's views as its samples: the
    # documented default, the first dimension of the first tensor.
    assert ItemsCounter()(([torch.zeros(4, 3, 2, 2)] * 2,)) == 4
    assert ItemsCounter()({"images": [_img()] * 8}) == 3
    # The batch itself a list of tensors: a collated (inputs, targets), counted inline.
    count = ItemsCounter()
    assert count([torch.zeros(6, 2), torch.zeros(6, 2)]) == 6 and count.first
    assert count(([torch.zeros(2, 1)], 0)) == 2  # a list of one, an int beside it


def test_a_batch_that_leaves_the_records_shape_is_walked_not_raised_on():
    # The records' path [1] was indexed unguarded: a dict batch raised KeyError, () IndexError.
    count = ItemsCounter()
    records = (tuple(_images(2)), ({"boxes": torch.zeros(1, 4)},) * 2)
    assert count(records) == 2
    assert count({"x": torch.zeros(5)}) == 5
    assert count(()) is None
    assert count(records) == 2


_SIZES = [(20, 30), (25, 17), (31, 31), (12, 40)]


def _pairs() -> tuple:
    """A super-resolution batch from tuple(zip(*b)): low-resolution images and their targets."""
    return (tuple(_img(h, w) for h, w in _SIZES), tuple(_img(2 * h, 2 * w) for h, w in _SIZES))


def test_image_to_image_pairs_count_their_samples():
    # Both columns are (3, H_i, W_i): the targets were taken for per-view targets (each with
    # the views' first dimension), and 3 channels counted.
    count = ItemsCounter()
    assert count(_pairs()) == 4 and not count.first
    assert count(((_img(20, 30),), (_img(40, 60),))) == 1
    assert ItemsCounter()(((_img(20, 30),), (_img(40, 60),))) == 1  # a batch of 1 first
    assert ItemsCounter()(([_img()] * 4, [_img(10, 10)] * 4)) == 4  # one size each
    # Per-view targets still tell views: of a lower rank (RotNet's), or of one shape where the
    # views' shapes vary.
    assert ItemsCounter()(([torch.zeros(5, 3, 4, 4)] * 4, [torch.zeros(5)] * 4)) == 5
    views = [torch.zeros(6, 3, 8, 8), torch.zeros(6, 3, 4, 4)]
    assert ItemsCounter()((views, [torch.zeros(6, 1, 1, 1)] * 2)) == 6


def test_the_order_of_the_columns_does_not_change_the_count():
    noisy, clean = _pairs()
    names = ("a.png", "b.png", "c.png", "d.png")
    for batch in ((noisy, clean, names), (noisy, names, clean), (noisy, clean)):
        count = ItemsCounter()
        assert [count(batch), count(batch)] == [4, 4] and not count.first, batch
    # Labels of the views' first dimension beside names of the views, either order: views.
    crops = [torch.zeros(8, 3, 4, 4)] * 2
    assert ItemsCounter()((crops, torch.zeros(8), ["global", "local"])) == 8
    assert ItemsCounter()((crops, ["global", "local"], torch.zeros(8))) == 8


def test_labels_of_neither_length_count_the_batch():
    # Each sample a list of variable-length segments: the first list is one sample's (2).
    count = ItemsCounter()
    for n in (8, 5):
        assert count(([[torch.zeros(5), torch.zeros(9)] for _ in range(n)], torch.zeros(n))) == n
    assert count.path == [1] and not count.first
    # Time-major views, each (T_i, B, D): neither 2 views nor T = 7 steps.
    count = ItemsCounter()
    for b in (16, 3):
        assert count(([torch.zeros(7, b, 4), torch.zeros(11, b, 4)], torch.zeros(b))) == b
    assert not count.first
    # Labels of two other lengths tell nothing: the lengths differ, as variable sequences do.
    seqs = [torch.zeros(t, 4) for t in (2, 5, 3)]
    assert ItemsCounter()((seqs, torch.zeros(8), torch.zeros(9))) == 3


class _Images(torch.utils.data.Dataset):
    """Images of varying sizes and int labels, as ImageFolder without a resize gives."""

    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int):
        return torch.rand(3, 6 + i % 3, 5 + i % 2), i % 2


def _stack_labels(samples):  # a custom collate: images as a list, labels as a tensor
    return [img for img, _ in samples], torch.tensor([y for _, y in samples])


def _train(logdir, collate) -> list:
    torch.manual_seed(0)
    model = torch.nn.Conv2d(3, 2, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    dl = torch.utils.data.DataLoader(_Images(), batch_size=4, collate_fn=collate)
    with tk.session(logdir=logdir, system_metrics=False):
        tk.patch(opt)
        for images, labels in tk.patch(dl):
            logits = torch.stack([model(img.unsqueeze(0)).mean((2, 3))[0] for img in images])
            torch.nn.functional.cross_entropy(logits, torch.as_tensor(labels)).backward()
            time.sleep(0.002)
            opt.step()
            opt.zero_grad()
    got = scalars(logdir)
    steps = dict(got["trainkit/step_time_ms"])
    return [round(v * steps[st] / 1e3) for st, v in got["trainkit/samples_per_s"]]


def test_a_training_loop_over_lists_of_images_counts_its_samples(tmp_path):
    # 10 images in batches of 4: samples/s said 3 per step, the channels.
    assert _train(tmp_path / "custom", _stack_labels) == [4, 4, 2]
    assert _train(tmp_path / "zip", lambda b: tuple(zip(*b))) == [4, 4, 2]


def test_a_loop_over_multi_crop_batches_counts_the_batch(tmp_path):
    batches = [([torch.zeros(b, 3, 4, 4)] * 2, torch.zeros(b)) for b in (4, 6, 3)]
    assert items_per_step(tmp_path, batches) == {1: 4, 2: 6, 3: 3}


def test_an_evaluation_pass_over_lists_of_images_counts_its_samples(tmp_path):
    # A pass begun under no_grad counts by _EvalItems, which reads ItemsCounter's count.
    batches = [(_images(n), torch.zeros(n)) for n in (5, 3, 3)]
    with torch.no_grad():
        assert items_per_step(tmp_path, batches) == {1: 5, 2: 3, 3: 3}
