"""arch=trm_local (models/variants/views_parts.GridOps): generic grid layers in every latent update. The 3 x 3
neighbourhood and the four running maxima equal a brute-force loop over the cells; with its output projection at
zero the core is trm_memory exactly (trm_memory's weights loaded: the layers add a term, and nothing else moves)."""

import pytest
import torch

from models.variants.views_parts import GridOps
from tests.test_models_memory import SIDE, B, batch, build, dead_parameters, eval_logits


def test_the_neighbourhood_is_every_cells_3x3_block_zero_beyond_the_canvas():
    a = torch.randn(2, 5, 5, 3)
    got = GridOps.neighbourhood(a).view(2, 5, 5, 9, 3)
    for y in range(5):
        for x in range(5):
            for k, (dy, dx) in enumerate((dy, dx) for dy in (-1, 0, 1) for dx in (-1, 0, 1)):
                yy, xx = y + dy, x + dx
                want = a[:, yy, xx] if 0 <= yy < 5 and 0 <= xx < 5 else torch.zeros(2, 3)
                torch.testing.assert_close(got[:, y, x, k], want)


def test_the_rays_are_the_running_max_from_each_edge_up_to_the_cell():
    a = torch.randn(2, 4, 6, 4 * 2)
    got = GridOps.rays(a)
    left, right, top, bottom = a.chunk(4, dim=-1)
    g = got.chunk(4, dim=-1)
    for y in range(4):
        for x in range(6):
            torch.testing.assert_close(g[0][:, y, x], left[:, y, : x + 1].amax(1))
            torch.testing.assert_close(g[1][:, y, x], right[:, y, x:].amax(1))
            torch.testing.assert_close(g[2][:, y, x], top[:, : y + 1, x].amax(1))
            torch.testing.assert_close(g[3][:, y, x], bottom[:, y:, x].amax(1))


def test_the_layers_leave_the_prefix_and_take_only_the_canvas_cells():
    ops = GridOps(side=3, hidden=8, ops=["neighbours", "rays"], width=2, prefix=2)
    h = torch.randn(4, 2 + 9, 8)
    out = ops(h)
    assert out.shape == h.shape and out[:, :2].abs().sum() == 0 and out[:, 2:].abs().sum() > 0
    h2 = h.clone()
    h2[:, :2] = torch.randn(4, 2, 8)  # the prefix is not read
    torch.testing.assert_close(ops(h2), out)


def test_with_a_zero_output_projection_the_core_is_trm_memory_exactly():
    memory, local = build(name="trm_memory"), build(name="trm_local")
    missing, unexpected = local.load_state_dict(memory.state_dict(), strict=False)  # trm_memory's weights
    assert unexpected == [] and sorted(missing) == ["inner.grid_ops.in_proj.weight", "inner.grid_ops.out_proj.weight"]
    data = batch()
    ref = eval_logits(memory, data)
    assert not torch.allclose(eval_logits(local, data), ref, atol=1e-4)
    with torch.no_grad():
        local.inner.grid_ops.out_proj.weight.zero_()
    torch.testing.assert_close(eval_logits(local, data), ref, atol=1e-5, rtol=1e-5)
    # grid_ops_out_init=0 (the default) builds it so: the layers start as a no-op, and the first update moves them
    start = build(name="trm_local", grid_ops_out_init=0.0)
    start.load_state_dict({**start.state_dict(), **memory.state_dict()})
    torch.testing.assert_close(eval_logits(start, data), ref, atol=1e-5, rtol=1e-5)
    assert dead_parameters(start) == ["inner.grid_ops.in_proj.weight"]  # behind a zero projection, at step 0 only


@pytest.mark.parametrize("ops", [["neighbours"], ["rays"]])
def test_each_layer_alone_builds_and_changes_the_answer(ops):
    model = build(name="trm_local", grid_ops=ops, grid_ops_width=4)
    n_out = 9 if ops == ["neighbours"] else 4
    assert model.inner.grid_ops.out_proj.weight.shape[1] == 4 * n_out
    data = batch()
    ref = eval_logits(model, data)
    with torch.no_grad():
        model.inner.grid_ops.out_proj.weight.mul_(3.0)
    assert not torch.allclose(eval_logits(model, data), ref, atol=1e-4)
    assert ref.shape[0] == B and ref.shape[1] >= SIDE * SIDE


def test_the_cell_descriptor_starts_as_a_no_op_and_then_reaches_the_test_cells_and_the_memory_keys():
    """``cell_descriptor``: one GridOps pass over each grid's embedding, added to the test input's cells and, through
    ``token_embeddings``, to every demo input cell the memory keys. At zero it is trm_local exactly (every other weight
    the same); moved, it changes the answer, a cell's embedding follows its neighbours and its rays, and the memory's
    keys change with it."""
    data = batch()
    plain = build(name="trm_local")
    desc = build(name="trm_local", cell_descriptor=True)
    missing, unexpected = desc.load_state_dict(plain.state_dict(), strict=False)
    assert unexpected == [] and sorted(missing) == [f"inner.descriptor.{p}_proj.weight" for p in ("in", "out")]
    ref = eval_logits(plain, data)
    torch.testing.assert_close(eval_logits(desc, data), ref, atol=1e-5, rtol=1e-5)
    # the other weights start as without it (the descriptor is drawn from a forked random stream)
    fresh = build(name="trm_local", cell_descriptor=True)
    for k, v in plain.state_dict().items():
        torch.testing.assert_close(fresh.state_dict()[k], v)
    with torch.no_grad():
        desc.inner.descriptor.out_proj.weight.normal_(0, 0.5)
    moved = eval_logits(desc, data)
    assert not torch.allclose(moved, ref, atol=1e-4)
    # what reaches a cell: its embedding changes when a neighbour changes colour (the cell itself unchanged), and a
    # cell outside its 3 x 3 block but on its row sees the change through the rays
    inner = desc.inner
    one = data["inputs"][:1].clone()
    nb = 1 * SIDE + 2  # the right neighbour of cell (1, 1) of the 3 x 3 grid
    other = one.clone()
    other[0, nb] = 2 + (int(one[0, nb]) - 1) % 10  # another colour (tokens 2..11)
    emb_a, emb_b = inner.token_embeddings(one)[0], inner.token_embeddings(other)[0]
    assert not torch.allclose(emb_a[1 * SIDE + 1], emb_b[1 * SIDE + 1], atol=1e-4)
    assert not torch.allclose(emb_a[1 * SIDE + 0], emb_b[1 * SIDE + 0], atol=1e-6)  # two cells left: the rays
    torch.testing.assert_close(emb_a[3 * SIDE + 0], emb_b[3 * SIDE + 0])  # neither in its block nor its row / column
    # the memory keys read the same descriptor: keys with it moved differ from keys with it at zero
    enc = desc.encoder(data["demo_inputs"], data["demo_labels"], data["demo_mask"])
    args = (enc.memory, data["demo_inputs"], data["demo_labels"], inner.token_embeddings, torch.float32)
    k_moved = inner.memory_read.keys(*args)[0]
    with torch.no_grad():
        inner.descriptor.out_proj.weight.zero_()
    k_zero = inner.memory_read.keys(*args)[0]
    assert not torch.allclose(k_moved, k_zero, atol=1e-4)
