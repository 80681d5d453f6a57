"""Differentiable hook replacements: a hook made with hl.tensor_hook gets the activation as an
hl.Tensor and gradients flow through the expression it returns; an array replacement is a
constant to autograd."""
import numpy as np
import pytest

import headlab as hl


def tiny(seed=0):
    cfg = dict(d_model=16, n_layers=2, n_heads=4, d_mlp=32, d_vocab=11, n_ctx=16)
    return hl.TransformerLM(hl.ModelConfig(**cfg), seed=seed)


IDS = np.array([[3, 7, 9, 1, 5], [4, 4, 2, 8, 6]])
TARGETS = np.array([[7, 9, 1, 5, 0], [4, 2, 8, 6, -1]])


def embed_grad(m, hooks=()):
    m.zero_grad()
    with m.hooks(fwd_hooks=hooks):
        m.loss(IDS, TARGETS).backward()
    g = m.named_parameters()["tok_emb.weight"].grad
    return None if g is None else np.asarray(g).copy()


def test_gradient_flows_through_a_tensor_hooks_expression():
    m = tiny()
    hooked = embed_grad(m, [("hook_embed", hl.tensor_hook(lambda x, name: 2 * x))])
    # the same forward without the hook: W_E doubled; its gradient is the one at the replacement
    doubled = tiny()
    np.asarray(doubled.W_E)[...] *= 2
    want = embed_grad(doubled)
    assert np.abs(want).max() > 0
    np.testing.assert_allclose(hooked, 2 * want, rtol=1e-6, atol=1e-9)
    # the logits are those of the doubled model
    with m.hooks(fwd_hooks=[("hook_embed", hl.tensor_hook(lambda x, name: 2 * x))]):
        np.testing.assert_array_equal(np.asarray(m(IDS)), np.asarray(doubled(IDS)))


def test_an_array_replacement_is_a_constant_to_autograd():
    m = tiny()
    g = embed_grad(m, [("hook_embed", lambda x, name: 2 * x)])  # NumPy: 2 * x is a new array
    assert g is None or not np.any(g)
    # the layers after the hook still get their gradient
    assert np.any(np.asarray(m.named_parameters()["blocks.0.attn.W_Q.weight"].grad))


def test_a_tensor_hook_returning_the_wrong_shape_is_named():
    m = tiny()
    with pytest.raises(ValueError, match="hook at hook_embed: the replacement has shape"):
        m.run_with_hooks(IDS, fwd_hooks=[("hook_embed", hl.tensor_hook(lambda x, name: x.sum()))])


def test_a_tensor_hook_edits_a_copy_and_an_edit_it_does_not_return_is_said():
    m = tiny()
    clean = np.asarray(m(IDS)).copy()

    def zero_in_place(x, name):  # edits what it was given and returns nothing
        np.asarray(x)[...] = 0

    with pytest.raises(ValueError, match="hook at hook_embed: the activation was edited in place; return the edited tensor"):
        with m.hooks(fwd_hooks=[("hook_embed", hl.tensor_hook(zero_in_place))]):
            m(IDS)
    np.testing.assert_array_equal(np.asarray(m(IDS)), clean)

    # an edit returned is the replacement
    def zero_and_return(x, name):
        np.asarray(x)[...] = 0
        return x

    with m.hooks(fwd_hooks=[("hook_embed", hl.tensor_hook(zero_and_return))]):
        edited = np.asarray(m(IDS))
    zeros = np.asarray(m.run_with_hooks(IDS, fwd_hooks=[("hook_embed", lambda x, name: np.zeros_like(x))]))
    np.testing.assert_array_equal(edited, zeros)
