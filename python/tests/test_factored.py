"""model.OV and model.QK as factored matrices: products, transposes, norms, singular values and
eigenvalues from the thin factors agree with the dense d_model x d_model products."""
import numpy as np
import pytest

import headlab as hl


def tiny(**kw):
    cfg = dict(d_model=16, n_layers=2, n_heads=4, d_mlp=32, d_vocab=11, n_ctx=16)
    cfg.update(kw)
    return hl.TransformerLM(hl.ModelConfig(**cfg), seed=3)


def test_ov_and_qk_are_the_heads_products():
    m = tiny()
    ov, qk = m.OV, m.QK
    assert isinstance(ov, hl.FactoredMatrix) and ov.shape == (2, 4, 16, 16) and ov.mdim == 4
    np.testing.assert_allclose(ov.AB, m.W_V @ m.W_O, atol=1e-6)
    np.testing.assert_allclose(qk[1, 2].AB, m.W_Q[1, 2] @ m.W_K[1, 2].T, atol=1e-6)
    np.testing.assert_allclose(ov[0, 3].BA, m.W_O[0, 3] @ m.W_V[0, 3], atol=1e-6)
    np.testing.assert_allclose(ov[1].T.AB, np.swapaxes(ov[1].AB, -1, -2), atol=1e-6)
    assert repr(ov[0, 1]) == "headlab.FactoredMatrix(shape (16, 16), inner dimension 4)"
    with pytest.raises(IndexError, match="FactoredMatrix: 3 indices for 2 leading axes"):
        ov[0, 1, 2]


def test_norm_svd_and_eigenvalues_match_the_dense_product():
    m = tiny()
    for fm in (m.OV[0, 1], m.QK[1, 3], m.OV):
        dense = fm.AB.astype(np.float64)
        np.testing.assert_allclose(fm.norm(), np.linalg.norm(dense, axis=(-2, -1)), rtol=1e-5)
        S_dense = np.linalg.svd(dense, compute_uv=False)[..., :fm.mdim]
        np.testing.assert_allclose(fm.S, S_dense, rtol=1e-4, atol=1e-6)
        U, S, V = fm.svd()
        np.testing.assert_allclose(U @ (S[..., :, None] * np.swapaxes(V, -1, -2)), dense, atol=1e-5)
    fm = m.OV[1, 0]
    dense_eig = np.linalg.eigvals(fm.AB.astype(np.float64))
    top = dense_eig[np.argsort(-np.abs(dense_eig))][:fm.mdim]  # the rest are zero: rank d_head
    ours = fm.eigenvalues
    np.testing.assert_allclose(np.sort_complex(ours), np.sort_complex(top), atol=1e-5)


def test_products_with_matrices_stay_factored():
    m = tiny()
    ov = m.OV[0, 0]
    W_E = np.asarray(m.W_E)  # [d_vocab, d_model]
    full = W_E @ ov @ np.asarray(m.W_U)  # the full OV circuit, [d_vocab, d_vocab], factored
    assert isinstance(full, hl.FactoredMatrix) and full.shape == (11, 11) and full.mdim == 4
    np.testing.assert_allclose(full.AB, W_E @ ov.AB @ np.asarray(m.W_U), atol=1e-5)
    np.testing.assert_allclose((ov @ m.QK[0, 0]).AB, ov.AB @ m.QK[0, 0].AB, atol=1e-5)
    with pytest.raises(ValueError, match="FactoredMatrix: A \\(3, 2\\) and B \\(3, 3\\) do not multiply"):
        hl.FactoredMatrix(np.ones((3, 2)), np.ones((3, 3)))
