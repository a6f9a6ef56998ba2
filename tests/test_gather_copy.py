"""``arch.gather_copy`` (models/variants/gather_copy.py): the answer may be the colour the learned gather reads.

The head's log-probabilities are the stated mixture (checked against a direct computation; they normalise; a head's
null mass falls back to the LM head); with the mixing weights on the gather and the counted form chosen, the model
answers a flip it never trained on cell by cell from three demos; at the start the LM head keeps 0.9 of the weight and
the answer's loss reaches the gather's gate and forms directly (behind the zero projection they get none without the
head); it refuses a core without a gather and a loss that is not the mixture's likelihood."""

import numpy as np
import pytest
import torch

from models.variants.gather_copy import COPY_BIAS, GatherCopy, demo_recolour
from models.variants.views_parts import FIRST_COLOUR
from tests.test_models_memory import HID, SIDE, V, batch, build, dead_parameters, eval_logits

KW = dict(name="trm_local", grid_gather=True, gather_maps=3, gather_heads=2, gather_width=4)


def test_the_logits_are_the_log_of_the_mixture_and_null_mass_falls_back_to_the_lm_head():
    torch.manual_seed(0)
    b, heads, S, P, vocab, hidden = 2, 2, 5, 1, 7, 8
    head = GatherCopy(hidden, heads, vocab, P)
    with torch.no_grad():
        head.mix.weight.normal_()
    logits, z = torch.randn(b, S, vocab), torch.randn(b, P + S, hidden)
    p = torch.softmax(torch.randn(b, heads, S, S + 1), -1)
    inputs = torch.randint(0, vocab, (b, S))
    got = head(logits, z, p, inputs)
    w = torch.softmax(head.mix(z[:, P:]), -1)
    want = torch.zeros(b, S, vocab)
    for n in range(b):
        for i in range(S):
            lm = torch.softmax(logits[n, i], -1)
            want[n, i] += w[n, i, 0] * lm
            for h in range(heads):
                want[n, i] += w[n, i, 1 + h] * p[n, h, i, S] * lm  # the null key: the LM head's answer
                for j in range(S):
                    want[n, i, inputs[n, j]] += w[n, i, 1 + h] * p[n, h, i, j]
    torch.testing.assert_close(got.exp(), want, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(got.exp().sum(-1), torch.ones(b, S))
    start = GatherCopy(hidden, heads, vocab, P).weights(z)  # W = 0: the bias alone
    lm_share = 1 / (1 + heads * np.exp(COPY_BIAS))
    torch.testing.assert_close(start[..., 0], torch.full((b, S), lm_share))
    assert lm_share > 0.9


def flip_batch(seed=0, recolour=None, palette=V - FIRST_COLOUR):
    """:func:`batch`'s shapes, every demo a horizontal flip of a grid (3 x 3, 2 x 3, 3 x 2) with distinct colours (the
    first ``palette``), the test input too; ``recolour`` [V] (token -> token): the flip's output recoloured, every grid
    holding the first colour it changes."""
    rng = np.random.default_rng(seed)
    data = batch(seed)
    b, D = data["demo_inputs"].shape[:2]
    recolour = np.arange(V) if recolour is None else recolour
    must = np.flatnonzero(recolour != np.arange(V))[:1]  # [] or the first colour recoloured

    def pair(h, w):
        rest = np.setdiff1d(np.arange(FIRST_COLOUR, FIRST_COLOUR + palette), must)
        x = rng.permutation(np.concatenate((must, rng.permutation(rest)))[: h * w]).reshape(h, w)
        c = [np.zeros((SIDE, SIDE), dtype=np.int64) for _ in range(2)]
        c[0][:h, :w], c[1][:h, :w] = x, recolour[x[:, ::-1]]
        return [torch.from_numpy(a).view(-1) for a in c]

    for i in range(b):
        for j in range(D):
            data["demo_inputs"][i, j], data["demo_labels"][i, j] = pair(*[(3, 3), (2, 3), (3, 2)][j])
        data["demo_mask"][i] = True
        data["inputs"][i], data["labels"][i] = pair(3, 3)
    return data


def copying_model(**kw):
    """An untrained model whose answer is the counted form's read: the mixing weights on the gather's heads, the
    gather's gate on the counted form, its read sharp and never null."""
    model = build(**KW, gather_demo_form=True, gather_copy=True, **kw)
    g, head = model.inner.gather, model.inner.copy
    with torch.no_grad():
        head.mix.weight.zero_()
        head.mix.bias.copy_(torch.tensor([-30.0, 30.0, 30.0]))  # the gather's heads answer
        g.gate.weight.zero_()
        g.gate.bias.copy_(torch.tensor(([0.0] * g.maps + [40.0]) * g.heads))  # both heads read the counted form
        g.demo_scale.fill_(3.0)
        g.demo_null.fill_(-1e4)
    return model


def test_with_the_weights_on_the_counted_read_the_model_answers_a_flip_it_never_learned():
    data = flip_batch()
    answer = eval_logits(copying_model(), data).argmax(-1)
    cells = data["inputs"] >= FIRST_COLOUR
    assert cells.sum() == 4 * 9
    assert (answer[cells] == data["labels"][cells]).all()  # the flip, held out: no weight was trained
    assert (data["labels"][cells] != data["inputs"][cells]).float().mean() > 0.5  # not the identity


def test_with_the_recolour_table_a_flip_that_also_recolours_is_answered_recoloured():
    """Demos of a flip whose output turns colour 3 into 11 (a colour no input holds; tokens 2-10 in the inputs): the
    counted table maps 3 to 11 and each other colour the demos show to itself (most of the row, >= 0.5: each demo is
    read by the other two demos' form), a colour they never show to itself; the copying model then answers the
    recoloured flip cell by cell, and without the table the plain flip."""
    swap = np.arange(V)
    swap[3] = 11
    data = flip_batch(seed=1, recolour=swap, palette=9)
    table = demo_recolour(copying_model().inner.gather, data["demo_inputs"], data["demo_labels"], data["demo_mask"])
    torch.testing.assert_close(table.sum(-1), torch.ones(table.shape[:2]))
    di = data["demo_inputs"][0][data["demo_mask"][0]]
    for k in range(FIRST_COLOUR, V):
        shown = int((di == k).sum())
        assert table[0, k].argmax() == swap[k] if shown else table[0, k, k] == 1.0, (k, shown, table[0, k])
        assert not shown or table[0, k, swap[k]] >= 0.5
    cells = data["inputs"] >= FIRST_COLOUR
    answer = eval_logits(copying_model(gather_copy_recolour=True), data).argmax(-1)
    assert (answer[cells] == data["labels"][cells]).all()
    plain = eval_logits(copying_model(), data).argmax(-1)
    flipped = torch.where(data["labels"] == 11, 3, data["labels"])  # the flip without the recolour
    assert (plain[cells] == flipped[cells]).all() and (flipped[cells] != data["labels"][cells]).any()


def test_at_the_start_the_answers_loss_reaches_the_gathers_forms_and_gate_through_the_head():
    plain, copy = build(**KW, gather_demo_form=True), build(**KW, gather_demo_form=True, gather_copy=True)
    missing, unexpected = copy.load_state_dict(plain.state_dict(), strict=False)
    assert sorted(missing) == ["inner.copy.mix.bias", "inner.copy.mix.weight"] and unexpected == []
    for k, v in plain.state_dict().items():  # drawn from a forked stream: every other weight as without it
        torch.testing.assert_close(copy.state_dict()[k], v)
    assert copy.inner.copy.mix.weight.shape == (3, HID)
    dead_plain, dead_copy = dead_parameters(plain), dead_parameters(copy)
    reached = {"inner.gather.forms", "inner.gather.gate.weight", "inner.gather.demo_scale"}
    assert reached <= set(dead_plain)  # behind the zero projection: no gradient without the head
    assert [n for n in dead_copy if ".copy." in n or n in reached] == []
    logits = eval_logits(copy, batch())
    torch.testing.assert_close(logits.exp().sum(-1), torch.ones(logits.shape[:-1]))


def test_it_needs_a_gather_and_the_softmax_loss():
    with pytest.raises(Exception, match="gather_copy=true copies what the learned gather reads: it needs grid_gather"):
        build(name="trm_local", gather_copy=True)
    with pytest.raises(Exception, match="gather_copy_recolour=true .* needs gather_copy=true and gather_demo_form"):
        build(**KW, gather_copy=True, gather_copy_recolour=True)
    with pytest.raises(Exception, match="loss_type='stable_max_cross_entropy' would not be its likelihood"):
        build(**KW, gather_copy=True, loss={"loss_type": "stable_max_cross_entropy"})


def test_with_its_own_loss_the_lm_head_is_trained_by_its_cross_entropy_alone_and_the_mixture_holds_it_fixed():
    """``gather_copy_lm_loss``: the term ``gather_copy_lm`` is each sample's mean softmax cross-entropy of the LM
    head's logits (taken by a hook on the head), the mixture's loss sends the LM head no gradient (it does without
    the option) and still reaches the copy's mixing weights and the gather; the loss head adds the term (weight 1)."""
    data = batch()
    for own in (False, True):
        model = build(**KW, gather_demo_form=True, gather_copy=True, gather_copy_lm_loss=own)
        model.train()
        seen = []
        model.inner.lm_head.register_forward_hook(lambda m, i, o, seen=seen: seen.append(o))
        carry, out = model(model.initial_carry(data), data)
        labels = data["labels"]
        mixture = torch.nn.functional.cross_entropy(out["logits"].reshape(-1, V), labels.reshape(-1))
        mixture.backward(retain_graph=True)
        lm_grad = model.inner.lm_head.weight.grad
        assert (lm_grad is not None and lm_grad.abs().sum() > 0) == (not own)
        assert model.inner.copy.mix.weight.grad.abs().sum() > 0 and model.inner.gather.gate.weight.grad.abs().sum() > 0
        if not own:
            assert "gather_copy_lm" not in out and "gather_copy_lm" not in model.extra_loss_weights
            continue
        lm = seen[-1][:, model.inner.puzzle_emb_len :].float()
        want = torch.nn.functional.cross_entropy(lm.reshape(-1, V), labels.reshape(-1), reduction="none")
        torch.testing.assert_close(out["gather_copy_lm"], want.view(labels.shape).mean(-1))
        assert model.extra_loss_weights["gather_copy_lm"] == 1.0
        model.zero_grad()
        out["gather_copy_lm"].sum().backward()
        assert model.inner.lm_head.weight.grad.abs().sum() > 0
    with pytest.raises(Exception, match="gather_copy_lm_loss=true .* needs gather_copy=true"):
        build(**KW, gather_copy_lm_loss=True)


def test_with_a_detached_state_the_mixture_trains_the_copy_and_the_gather_never_the_trunk():
    """``gather_copy_detach``: the copy's mixing weights and pointer read z_H detached, so the mixture's loss (with the
    LM head's own loss, the LM logits held fixed) reaches the mixing weights and the gather's gate and forms, and no
    weight of the trunk; without the option it reaches the trunk."""
    data = batch()
    for detach in (False, True):
        torch.manual_seed(0)
        model = build(**KW, gather_demo_form=True, gather_copy=True, gather_copy_lm_loss=True, gather_copy_detach=detach)
        model.train()
        carry, out = model(model.initial_carry(data), data)
        mixture = torch.nn.functional.cross_entropy(out["logits"].reshape(-1, V), data["labels"].reshape(-1))
        mixture.backward()
        trunk = [p.grad for n, p in model.named_parameters() if n.startswith("inner.L_level")]
        reached = any(g is not None and g.abs().sum() > 0 for g in trunk)
        assert reached == (not detach)
        assert model.inner.copy.mix.weight.grad.abs().sum() > 0 and model.inner.gather.gate.weight.grad.abs().sum() > 0
