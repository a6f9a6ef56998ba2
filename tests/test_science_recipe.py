"""The science recipe's data side: consistent colour augmentation of the recolour train split
(experiments.science.recolour.write_recolour_dataset(colour_aug=K)) multiplies the rule instances seen in
training without ever showing a held-out one: with K = 4, 76 distinct training instances instead of 20 (50842d3,
docs/record/2026-11-23-recolour-ablations.md); copies whose queries are permuted apart from their demos give held-out
0.00 (41f1351, docs/record/2026-11-23-recolour-one-factor-at-a-time.md)."""

import numpy as np
import pytest

from dataset.canvas import canvas_to_grid
from dataset.loader import create_dataloader
from experiments.science.recolour import write_recolour_dataset


def _changed(x, y):
    return {(int(a), int(b)) for a, b in zip(x.ravel(), y.ravel()) if a != b}


def _puzzle_rules(path, split, demos_agree=True):
    """The instance of every example from the loader's encoder-mode batches; with ``demos_agree`` its demos must
    show the same instance, else (instance, instance its demos show) pairs are returned."""
    loader, meta = create_dataloader(
        dict(data_paths=[path], global_batch_size=16, test_mode=True, encoder_mode=True), split
    )
    rules = []
    for _, batch, _ in loader:
        for i in range(batch["inputs"].shape[0]):
            if batch["example_index"][i] < 0:
                continue
            x = canvas_to_grid(batch["inputs"][i].numpy(), size=4)
            lab = batch["labels"][i].numpy()
            y = canvas_to_grid(np.where(lab < 0, 0, lab), size=4)
            changed = _changed(x, y)
            assert len(changed) == 1
            ((a, b),) = changed
            shown = set()
            for d in range(int(batch["demo_mask"][i].sum())):
                dx = canvas_to_grid(batch["demo_inputs"][i, d].numpy(), size=4)
                dy = canvas_to_grid(batch["demo_labels"][i, d].numpy(), size=4)
                shown |= _changed(dx, dy)
                if demos_agree:  # the demos show the query's rule
                    assert np.array_equal(np.where(dx == a, b, dx), dy)
            assert len(shown) == 1
            rules.append((a, b) if demos_agree else ((a, b), shown.pop()))
    return rules, meta


def test_colour_aug_multiplies_train_instances_and_never_shows_a_heldout_one(tmp_path):
    kw = dict(
        grid=3, num_colours=5, num_test_instances=4, train_puzzles_per_instance=3, test_puzzles_per_instance=2, seed=3
    )
    plain = write_recolour_dataset(str(tmp_path / "plain"), **kw)
    aug = write_recolour_dataset(str(tmp_path / "aug"), colour_aug=3, **kw)
    assert aug["test_instances"] == plain["test_instances"]  # the held-out instances do not move
    heldout = set(map(tuple, plain["test_instances"]))
    rules, meta = _puzzle_rules(str(tmp_path / "aug"), "train")
    n_plain = len(plain["train_instances"]) * 3
    assert meta.total_groups == 3 * n_plain and len(rules) == 3 * n_plain * 2  # K copies, 2 queries each
    assert not set(rules) & heldout
    assert set(rules) == set(map(tuple, aug["train_instances"]))
    # colours 1..9 are permuted (0 fixed): far more instances than the 12 drawn, and colours beyond the 5 drawn
    assert len(set(rules)) > 2 * len(plain["train_instances"])
    assert max(max(r) for r in rules) >= 5
    # the held-out split is the same data with and without augmentation
    for name in ("inputs", "labels", "demo_inputs", "demo_labels"):
        np.testing.assert_array_equal(
            np.load(tmp_path / "plain" / "test" / f"all__{name}.npy"),
            np.load(tmp_path / "aug" / "test" / f"all__{name}.npy"),
        )
    with pytest.raises(ValueError, match="colour_aug"):
        write_recolour_dataset(str(tmp_path / "bad"), colour_aug=-1, **kw)


def test_inconsistent_colour_aug_ablation(tmp_path):
    """colour_aug_consistent=False (the ablation): a copy's queries follow another instance than its demos, and
    still no held-out instance appears in training."""
    kw = dict(
        grid=3,
        num_colours=5,
        num_test_instances=4,
        train_puzzles_per_instance=3,
        test_puzzles_per_instance=2,
        seed=3,
        colour_aug=3,
    )
    info = write_recolour_dataset(str(tmp_path / "inc"), colour_aug_consistent=False, **kw)
    pairs, _ = _puzzle_rules(str(tmp_path / "inc"), "train", demos_agree=False)
    heldout = set(map(tuple, info["test_instances"]))
    assert sum(q != d for q, d in pairs) > 0.9 * len(pairs)
    assert not {q for q, _ in pairs} & heldout and not {d for _, d in pairs} & heldout
    assert {q for q, _ in pairs} | {d for _, d in pairs} == set(map(tuple, info["train_instances"]))
