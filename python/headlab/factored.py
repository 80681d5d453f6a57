"""TransformerLens's FactoredMatrix: a product A @ B kept as its thin factors, A (..., ldim, mdim)
and B (..., mdim, rdim), so that a head's OV or QK circuit (d_model x d_model of rank d_head) is
studied without forming the square product: its SVD, norm and eigenvalues come from the factors.

``model.OV`` = FactoredMatrix(W_V, W_O) and ``model.QK`` = FactoredMatrix(W_Q, W_K^T), both
[n_layers, n_heads, d_model, d_model] as products; ``model.OV[layer, head]`` is one head's.
"""
import numpy as np


def _t(x):
    return np.swapaxes(x, -1, -2)


class FactoredMatrix:
    """A @ B of A (..., ldim, mdim) and B (..., mdim, rdim), with the leading axes broadcast."""

    __array_ufunc__ = None  # array @ FactoredMatrix: NumPy defers to __rmatmul__ (stays factored)

    def __init__(self, A, B):
        A, B = np.asarray(A), np.asarray(B)
        if A.ndim < 2 or B.ndim < 2 or A.shape[-1] != B.shape[-2]:
            raise ValueError(f"FactoredMatrix: A {A.shape} and B {B.shape} do not multiply (A's last axis must be B's "
                             "second to last)")
        lead = np.broadcast_shapes(A.shape[:-2], B.shape[:-2])
        self.A = np.broadcast_to(A, lead + A.shape[-2:])
        self.B = np.broadcast_to(B, lead + B.shape[-2:])

    ldim = property(lambda self: self.A.shape[-2], doc="Rows of the product")
    mdim = property(lambda self: self.A.shape[-1], doc="The inner dimension (the rank at most)")
    rdim = property(lambda self: self.B.shape[-1], doc="Columns of the product")
    shape = property(lambda self: self.A.shape[:-1] + (self.rdim,), doc="The product's shape")
    ndim = property(lambda self: len(self.shape))

    @property
    def AB(self):
        """The product A @ B (formed: (..., ldim, rdim))."""
        return self.A @ self.B

    @property
    def BA(self):
        """B @ A (..., mdim, mdim): the same nonzero eigenvalues as AB (needs ldim == rdim)."""
        if self.ldim != self.rdim:
            raise ValueError(f"FactoredMatrix.BA: the product is {self.ldim} x {self.rdim}, not square")
        return self.B @ self.A

    @property
    def T(self):
        """The transpose, (A @ B)^T = B^T @ A^T, still factored."""
        return FactoredMatrix(_t(self.B), _t(self.A))

    def __matmul__(self, other):
        if isinstance(other, FactoredMatrix):
            return FactoredMatrix(self.A, (self.B @ other.A) @ other.B)
        return FactoredMatrix(self.A, self.B @ np.asarray(other))

    def __rmatmul__(self, other):
        return FactoredMatrix(np.asarray(other) @ self.A, self.B)

    def __mul__(self, scalar):
        return FactoredMatrix(self.A * scalar, self.B)

    __rmul__ = __mul__

    def __getitem__(self, idx):
        """Indexes the leading axes: ``model.OV[layer, head]``, ``model.OV[layer]``."""
        idx = idx if isinstance(idx, tuple) else (idx,)
        if len(idx) > len(self.A.shape) - 2:
            raise IndexError(f"FactoredMatrix: {len(idx)} indices for {len(self.A.shape) - 2} leading axes "
                             f"(the product's shape is {self.shape})")
        return FactoredMatrix(self.A[idx], self.B[idx])

    def svd(self):
        """(U, S, V) with A @ B = U @ diag(S) @ V^T, U (..., ldim, mdim), S (..., mdim), V (..., rdim, mdim),
        as TransformerLens returns them: from the factors' SVDs and an mdim x mdim one, never from AB."""
        Ua, Sa, Vha = np.linalg.svd(self.A, full_matrices=False)
        Ub, Sb, Vhb = np.linalg.svd(self.B, full_matrices=False)
        middle = Sa[..., :, None] * (Vha @ Ub) * Sb[..., None, :]
        Um, S, Vhm = np.linalg.svd(middle)
        return Ua @ Um, S, _t(Vhm @ Vhb)

    @property
    def S(self):
        """The singular values, largest first (..., mdim)."""
        return self.svd()[1]

    @property
    def U(self):
        return self.svd()[0]

    @property
    def Vh(self):
        """V^T of the SVD (..., mdim, rdim)."""
        return _t(self.svd()[2])

    @property
    def eigenvalues(self):
        """The eigenvalues of the square product that can be nonzero (..., mdim), from B @ A."""
        return np.linalg.eigvals(self.BA)

    def norm(self):
        """The Frobenius norm of the product (...,), from the singular values."""
        return np.sqrt((self.S ** 2).sum(-1))

    def __repr__(self):
        return f"headlab.FactoredMatrix(shape {self.shape}, inner dimension {self.mdim})"


def _ov(self):
    return FactoredMatrix(self.W_V, self.W_O)


def _qk(self):
    return FactoredMatrix(self.W_Q, _t(self.W_K))
