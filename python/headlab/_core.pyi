"""Type stub of headlab._core (written by scripts/python_stub.py from the module's signatures)."""
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union, overload

import numpy

class ActivationCache:
    """Activations by hook name (read-only array views) and their gradients"""
    def __getitem__(self, key: object) -> numpy.ndarray:
        """cache[name] or cache[name, layer(, layer_type)] (as get_act_name): a read-only view of the activation; a name ending in _grad (cache['blocks.0.attn.hook_q_grad'], cache['q_grad', 0]) gives the gradient there (run_with_cache(incl_bwd=True), then backward())"""
    def grad(self, key: object) -> numpy.ndarray:
        """The gradient at a hook (run_with_cache(incl_bwd=True), then backward())"""
    def __contains__(self, arg0: object) -> bool:
        ...
    def has_grad(self, key: object) -> bool:
        """Whether the cache holds the gradient at this hook (after backward())"""
    def __repr__(self) -> str:
        ...
    def keys(self) -> List[str]:
        """The cached hook names"""
    def __len__(self) -> int:
        ...
    def __iter__(self) -> Iterator:
        ...
    def decompose_resid(self, layer: object = ..., pos_slice: object = ..., apply_ln: bool = ..., return_labels: bool = ...) -> object:
        """Components whose sum is the residual stream entering `layer` (-1/None = the final one): (C, B, T, d_model), or (C, B, d_model) with pos_slice; labels embed, pos_embed, L{l}H{h}, {l}_attn_bias, {l}_attn_norm_bias, {l}_mlp_out"""
    def stack_head_results(self, layer: object = ..., pos_slice: object = ..., apply_ln: bool = ..., return_labels: bool = ...) -> object:
        """Each head's output (hook_result) of the layers before `layer`: (layer*heads, B, T, d_model), labels L{l}H{h}"""
    def accumulated_resid(self, layer: object = ..., pos_slice: object = ..., apply_ln: bool = ..., return_labels: bool = ...) -> object:
        """The residual stream entering each layer up to `layer` ({l}_pre) and, for the last, final_post: the logit lens's inputs"""
    def apply_ln_to_stack(self, residual_stack: object, layer: object = ..., pos_slice: object = ...) -> numpy.ndarray:
        """Each component centred and divided by the cached scale of the layer norm reading the residual entering `layer` (None = ln_final); its weight is folded into logit_attrs's directions"""
    def logit_attrs(self, residual_stack: object, tokens: object, incorrect_tokens: object = ..., pos_slice: object = ...) -> numpy.ndarray:
        """Each (layer-normed) component projected on ln_final.weight * W_U[:, token] (minus incorrect_tokens'): (C, B, T) or (C, B)"""
    def final_bias_term(self, token: int, incorrect_token: object = ...) -> float:
        """ln_final.bias . W_U[:, token] (+ the unembedding bias): the part of the logit no component carries"""
    @property
    def model(self) -> object:
        """The model whose forward this is"""
    @property
    def ids(self) -> numpy.ndarray:
        """The forward's input ids (B, T)"""
    def items(self) -> Any:
        """(name, activation) of every cached hook, as a dict's items (TransformerLens's cache.items())."""
    def values(self) -> Any:
        """Every cached activation, in the order of keys()."""

class Batches:
    """Batches of held-out rows: a task's (Task.held_out), a probe's, or your arrays"""
    def __init__(self, input_ids: object, targets: object = ..., loss_mask: object = ..., batch_size: object = ..., prompt_len: object = ..., attention_mask: object = ...) -> None:
        """Batches(input_ids (N, T), targets=None, loss_mask=None, batch_size=128, prompt_len=None, attention_mask=None), or Batches({'input_ids': ..., 'targets': ..., 'loss_mask': ...}): rows by the tokens task's rule (targets -1 = not counted; without targets position t predicts input t+1; loss_mask 0 = not counted). attention_mask (1 = token, 0 = padding): rows of different lengths padded on either side, each analysed as the row alone (padding neither attended to nor counted); a left-padded row's tokens are moved to its first columns (prompt_len counts the padded columns, as the ids)"""
    @property
    def rows(self) -> int:
        """Rows over all batches"""
    def __len__(self) -> int:
        ...
    def __getitem__(self, i: int) -> dict:
        """Batch i as a dict of arrays (input_ids, targets, prompt_len)"""

class HeadlabError(ValueError):
    """An error of the C++ library (bad input): its one-line message is the command line's"""

class ModelConfig:
    """The model's settings, by TransformerLens's names where it has one.

ModelConfig(**settings): n_layers, n_heads, d_model, d_head, d_mlp, d_vocab, n_ctx,
n_key_value_heads, norm, activation, positions, attn_bias, mlp_bias, head_bias, eps, dropout,
attn_dropout, the block options normalization, sandwich_norm, mlp, parallel_block, embed_scale,
final_softcap, the attention options rope_theta, rope_theta_local, rotary_dim, rotary_pct, rotary_style, qk_norm,
attn_scale, attn_softcap, sliding_window, window_layers, qkv_bias, o_bias, and arch (a preset's
name: its settings, unless given); each also by its CLI flag's name (layers=, heads=, kv_heads=, d_ff=, vocab_size=,
max_seq_len=, layer_norm_eps=). TransformerLens's act_fn ('gelu', 'gelu_new', 'silu', ...), normalization_type
('LN', 'RMS'), positional_embedding_type ('standard', 'rotary', ...) and original_architecture ('LlamaForCausalLM', ...)
are read as attributes and taken as keywords for activation, normalization, positions and arch. What is not given takes the CLI's default.
ModelConfig(**cfg.to_dict()) gives cfg back."""
    def __init__(self, **kwargs: Any) -> None:
        """ModelConfig(**settings): the names are listed in the class's help; unknown ones raise TypeError"""
    @property
    def d_vocab(self) -> object:
        """Vocabulary size"""
    @property
    def d_model(self) -> object:
        """Residual stream width"""
    @property
    def n_layers(self) -> object:
        """Transformer blocks"""
    @property
    def n_heads(self) -> object:
        """Attention heads per layer"""
    @property
    def n_key_value_heads(self) -> object:
        """Key/value heads (grouped-query attention); = n_heads without"""
    @property
    def d_head(self) -> object:
        """Head size"""
    @property
    def d_mlp(self) -> object:
        """Feed-forward width; 0 = attention-only"""
    @property
    def n_ctx(self) -> object:
        """Longest sequence (positions)"""
    @property
    def norm(self) -> object:
        """pre or post LayerNorm"""
    @property
    def activation(self) -> object:
        """gelu_erf, gelu_tanh, relu, relu2 or silu (mlp swiglu: silu)"""
    @property
    def positions(self) -> object:
        """learned, sinusoidal, rotary or none"""
    @property
    def attn_bias(self) -> object:
        """Biases on W_Q, W_K, W_V, W_O"""
    @property
    def mlp_bias(self) -> object:
        """Biases on the feed-forward layers"""
    @property
    def head_bias(self) -> object:
        """A bias on the unembedding (b_U)"""
    @property
    def eps(self) -> object:
        """LayerNorm epsilon"""
    @property
    def dropout(self) -> object:
        """Dropout on embeddings and residual branches"""
    @property
    def attn_dropout(self) -> object:
        """Dropout on attention weights"""
    @property
    def normalization(self) -> object:
        """layernorm, rmsnorm or rmsnorm_1p"""
    @property
    def sandwich_norm(self) -> object:
        """A norm on attention's and the MLP's output (Gemma 2)"""
    @property
    def mlp(self) -> object:
        """plain, swiglu or geglu"""
    @property
    def parallel_block(self) -> object:
        """x + attn(ln1 x) + mlp(ln2 x)"""
    @property
    def embed_scale(self) -> object:
        """Token embeddings times sqrt(d_model)"""
    @property
    def final_softcap(self) -> object:
        """Logit soft-cap; 0 = none"""
    @property
    def rope_theta(self) -> object:
        """Rotary positions: the angles' base"""
    @property
    def rope_theta_local(self) -> object:
        """Rotary positions: the local layers' angles' base; 0 = rope_theta"""
    @property
    def rotary_dim(self) -> object:
        """Rotary positions: dims of each head that turn; 0 = rotary_pct's"""
    @property
    def rotary_pct(self) -> object:
        """Rotary positions, rotary_dim 0: the fraction of each head that turns"""
    @property
    def rotary_style(self) -> object:
        """half (rotate-half) or interleaved (GPT-J)"""
    @property
    def qk_norm(self) -> object:
        """RMSNorm over d_head on queries and keys"""
    @property
    def attn_scale(self) -> object:
        """Score scale; 0 = 1/sqrt(d_head)"""
    @property
    def attn_softcap(self) -> object:
        """Attention score soft-cap; 0 = none"""
    @property
    def sliding_window(self) -> object:
        """Local layers' window; 0 = none"""
    @property
    def window_layers(self) -> object:
        """all, alternate or L:G"""
    @property
    def qkv_bias(self) -> object:
        """Biases on W_Q, W_K, W_V"""
    @property
    def o_bias(self) -> object:
        """Bias on W_O"""
    @property
    def arch(self) -> object:
        """The --arch preset it was made with ('' = none)"""
    @property
    def act_fn(self) -> object:
        """TransformerLens's activation name (TL: gelu = erf, gelu_new = tanh)"""
    @property
    def normalization_type(self) -> object:
        """TransformerLens's norm name: LN or RMS (Gemma's 1 + w reads as RMS)"""
    @property
    def positional_embedding_type(self) -> object:
        """TransformerLens's positions: standard (learned), sinusoidal or rotary"""
    @property
    def original_architecture(self) -> object:
        """The Hugging Face class of the --arch preset (None: none)"""
    def to_dict(self) -> dict:
        """{name: value} of every setting, by the names ModelConfig(...) takes"""
    def __eq__(self, arg0: ModelConfig) -> bool:
        ...
    def __repr__(self) -> str:
        ...

class NonFiniteError(FloatingPointError):
    """A NaN or Inf where a finite value is needed (a loss, a weight)"""

class SAE:
    """A sparse autoencoder in SAELens's layout: W_enc (d_in, d_sae), b_enc, W_dec (d_sae, d_in),
b_dec, and for JumpReLU its thresholds. encode(x) = act((x - b_dec) W_enc + b_enc), decode(f) = f W_dec + b_dec,
forward(x) = the reconstruction of x in x's units. With normalize_activations="layer_norm", encode normalises each row
first and decode's output is in those normalised units: forward(x) (and the splice) scale it back."""
    @property
    def d_in(self) -> int:
        """Input width (a hook point's values per token)"""
    @property
    def d_sae(self) -> int:
        """Number of features"""
    @property
    def architecture(self) -> str:
        """standard, topk, batchtopk or jumprelu"""
    @property
    def hook_name(self) -> str:
        """The hook point it reads"""
    @property
    def hook_name_out(self) -> str:
        """A transcoder: the hook point it reconstructs (its splice replaces it); empty for an SAE"""
    @property
    def d_out(self) -> int:
        """Output width (d_in for an SAE)"""
    @property
    def W_enc(self) -> numpy.ndarray:
        """(d_in, d_sae), read-only view"""
    @property
    def W_dec(self) -> numpy.ndarray:
        """(d_sae, d_in), read-only view: the rows are the features' directions"""
    @property
    def b_enc(self) -> numpy.ndarray:
        """(d_sae), read-only view"""
    @property
    def b_dec(self) -> numpy.ndarray:
        """(d_in), read-only view"""
    @property
    def normalize_activations(self) -> str:
        """none, or layer_norm: encode normalises each row, decode's output is in those units"""
    def encode(self, x: numpy.ndarray) -> numpy.ndarray:
        """Feature activations (N, d_sae) of activations x (N, d_in)"""
    def decode(self, f: numpy.ndarray) -> numpy.ndarray:
        """f W_dec + b_dec (N, d_out) of feature activations f (N, d_sae): in the normalised units when normalize_activations is layer_norm (forward(x) gives x's units)"""
    def forward(self, x: numpy.ndarray) -> numpy.ndarray:
        """The reconstruction (N, d_out) of activations x (N, d_in), in x's units (what the splice writes)"""
    def __call__(self, x: numpy.ndarray) -> numpy.ndarray:
        """sae(x) = sae.forward(x)"""
    def save(self, dir: str | os.PathLike) -> None:
        """Writes dir/cfg.json and dir/sae_weights.safetensors in SAELens's layout"""
    @staticmethod
    def load(dir: str | os.PathLike) -> SAE:
        """Reads an SAE saved by save() or by SAELens (standard, topk, jumprelu; cfg.json + sae_weights.safetensors)"""

class Task:
    """A task of the command line (copy, varcopy, induction, text, tokens, ...): its data and vocabulary"""
    def __init__(self, name: str = ..., **kwargs: Any) -> None:
        """Task('varcopy', length=..., alphabet=..., data=...): a task with the CLI's settings by keyword"""
    @property
    def name(self) -> str:
        """The task's name"""
    @property
    def vocab_size(self) -> int:
        """Its vocabulary size (a model's d_vocab)"""
    @property
    def seq_len(self) -> int:
        """The length of its rows"""
    @property
    def symbols(self) -> int:
        """Ids 0..symbols-1 are ordinary symbols (special tokens come after): what a corruption may use"""
    @property
    def rows_are_answers(self) -> bool:
        """Whether a row's targets form one answer, so exact match means something (False for language modelling: text, token data without targets or loss_mask)"""
    def held_out(self, n: int = ..., seed: int = ..., batch: int = ...) -> Batches:
        """n held-out rows (Batches of `batch` rows), the same for the same seed"""
    def sample(self, batch: int = ..., seed: int = ...) -> dict:
        """A training-style batch: input_ids, targets, prompt_len"""
    def token_text(self, id: int) -> str:
        """The text of a token of the task (its symbol's name)"""

class Tensor:
    """float32 tensor; np.asarray(t) is a view of its memory"""
    @property
    def shape(self) -> tuple:
        """The sizes of its axes (a tuple)"""
    @property
    def ndim(self) -> int:
        """How many axes it has"""
    def numpy(self) -> numpy.ndarray:
        """A view of the tensor's memory (no copy)"""
    def item(self) -> float:
        """The value of a one-element tensor (float)"""
    @property
    def requires_grad(self) -> bool:
        """Whether backward() fills in its gradient (settable on a leaf)"""
    @property
    def grad(self) -> object:
        """Its gradient after backward() (a Tensor), or None"""
    def backward(self) -> None:
        """Fills in the gradients of every tensor it was computed from (a one-element tensor)"""
    def zero_grad(self) -> None:
        """Clears its gradient"""
    def retain_grad(self) -> None:
        """Keeps the gradient of this non-leaf tensor after backward()"""
    def detach(self) -> Tensor:
        """The same values, out of the graph (shares memory)"""
    def clone(self) -> Tensor:
        """A copy (in the graph)"""
    def __repr__(self) -> str:
        ...
    def __add__(self, arg0: Tensor) -> Tensor:
        ...
    def __sub__(self, arg0: Tensor) -> Tensor:
        ...
    @overload
    def __mul__(self, arg0: Tensor) -> Tensor:
        ...
    @overload
    def __mul__(self, arg0: float) -> Tensor:
        ...
    def __rmul__(self, arg0: float) -> Tensor:
        ...
    def __matmul__(self, arg0: Tensor) -> Tensor:
        ...
    def sum(self) -> Tensor:
        """The sum of every element (a one-element tensor)"""
    def mean(self) -> Tensor:
        """The mean of every element (a one-element tensor)"""

class Tokenizer:
    """A BPE tokenizer giving the same ids as Hugging Face's tokenizers: a tokenizer.json (GPT-NeoX/Pythia, Qwen2/3, SmolLM2, Llama 2/3, Gemma) or GPT-2's files."""
    @staticmethod
    def load(dir: str | os.PathLike) -> Tokenizer:
        """From a directory with tokenizer.json (and tokenizer_config.json), vocab.json + merges.txt (Hugging Face's GPT-2) or encoder.json + vocab.bpe (OpenAI)."""
    def encode(self, text: object, add_special_tokens: bool = ...) -> List[int]:
        """The token ids of text (str, or UTF-8 bytes) as a list of int; special tokens such as '<|endoftext|>' are one id each. add_special_tokens: the BOS/EOS the tokenizer's files add around a text (as Hugging Face's encode)."""
    def decode(self, ids: object, skip_special_tokens: bool = ...) -> str:
        """The text of ids (str) through the tokenizer's decoder; bytes that are no whole character become U+FFFD."""
    def decode_bytes(self, ids: object, skip_special_tokens: bool = ...) -> bytes:
        """The exact bytes of ids through the tokenizer's decoder."""
    @property
    def vocab_size(self) -> int:
        """How many tokens it has"""
    @property
    def special_tokens(self) -> List[str]:
        """Its special tokens' texts, e.g. <|endoftext|>, <s>"""
    @property
    def bos_token_id(self) -> object:
        """The id a text starts with under prepend_bos (GPT-2: <|endoftext|>; tokenizer.json: its post-processor's or tokenizer_config.json's bos_token), or None"""
    def token_to_id(self, token: str) -> object:
        """The id of a vocabulary entry as written in the files (e.g. 'Ġworld', '▁world'), or None"""
    def token_text(self, id: int) -> str:
        """The token's text for display (control characters and partial characters escaped, e.g. '\\\\n', '\\\\xf0')."""
    def __len__(self) -> int:
        ...
    def __repr__(self) -> str:
        ...

class TransformerLM:
    """A decoder-only transformer language model.

TransformerLM(config, seed=0) builds one (hl.ModelConfig); TransformerLM.load(path) reads a
checkpoint. model.cfg holds its settings by TransformerLens's names (cfg.n_layers, cfg.n_heads,
cfg.d_model, cfg.d_head, ...). model(ids) gives the logits (B, T, d_vocab);
run_with_cache(ids, names_filter=...) the logits and the activations by hook name;
model.hooks(fwd_hooks=[(name, fn)]) runs hooks in every forward of a with block.
The weights in TransformerLens's shapes: W_Q, W_K, W_V [n_layers, n_heads, d_model, d_head],
W_O [n_layers, n_heads, d_head, d_model], b_Q/b_K/b_V [n_layers, n_heads, d_head],
b_O [n_layers, d_model], W_E [d_vocab, d_model], W_pos [n_ctx, d_model], W_U [d_model, d_vocab]."""
    def __init__(self, config: ModelConfig, seed: int = ...) -> None:
        """A model of this config, initialised from seed"""
    @staticmethod
    def load(path: str | os.PathLike) -> object:
        """A model from a headlab checkpoint (safetensors) or a Hugging Face model directory (with its tokenizer files, tokenizer.json or GPT-2's: model.tokenizer)"""
    def save(self, path: str | os.PathLike) -> None:
        """Writes a checkpoint the CLI reads (atomic)"""
    def load_parameters(self, path: str | os.PathLike) -> None:
        """Reads the parameters of a checkpoint of the same config into this model"""
    @property
    def cfg(self) -> ModelConfig:
        """The model's settings (a ModelConfig, TransformerLens's names)"""
    @property
    def config(self) -> ModelConfig:
        """The same as cfg (the older name)"""
    def __repr__(self) -> str:
        ...
    def train(self, on: bool = ...) -> None:
        """Training mode (dropout on) or, with on=False, evaluation mode"""
    def eval(self) -> None:
        """Evaluation mode (no dropout)"""
    def forward(self, ids: object, attention_mask: object = ..., return_type: object = ...) -> object:
        """ids (T) or (B, T) -> logits (B, T, d_vocab), with the hooks the model holds (add_hook). attention_mask (B, T), 1 = token, 0 = padding, runs prompts of different lengths padded on either side (model.to_tokens(texts, padding_side=...) makes both): padding is never attended to, and a row's positions count its tokens from its first (as alone). return_type (TransformerLens's): 'logits', 'loss' (the mean next-token cross-entropy, a tensor to call backward() on; padding not counted), 'both' ((logits, loss)) or None"""
    def __call__(self, ids: object, attention_mask: object = ..., return_type: object = ...) -> object:
        """The same as forward(ids, attention_mask, return_type)"""
    def loss(self, ids: object, targets: object, attention_mask: object = ...) -> Tensor:
        """Mean cross-entropy over targets != -1 (a tensor; call backward()); no counted target raises ValueError. With attention_mask, padding positions must have target -1"""
    def named_parameters(self) -> dict:
        """name -> Tensor (headlab's parameter names; np.asarray gives a view)"""
    def zero_grad(self) -> None:
        """Clears every parameter's gradient"""
    @property
    def W_Q(self) -> numpy.ndarray:
        """[n_layers, n_heads, d_model, d_head]: a copy (headlab keeps W_Q.weight as (heads*d_head, d_model) per layer)"""
    @property
    def W_K(self) -> numpy.ndarray:
        """[n_layers, n_heads, d_model, d_head]: a copy; with grouped-query attention each head's key/value head (_W_K: the kv heads)"""
    @property
    def W_V(self) -> numpy.ndarray:
        """[n_layers, n_heads, d_model, d_head]: a copy; with grouped-query attention each head's key/value head (_W_V: the kv heads)"""
    @property
    def W_O(self) -> numpy.ndarray:
        """[n_layers, n_heads, d_head, d_model]: a copy"""
    @property
    def b_Q(self) -> numpy.ndarray:
        """[n_layers, n_heads, d_head]: a copy (zeros without attention biases)"""
    @property
    def b_K(self) -> numpy.ndarray:
        """[n_layers, n_heads, d_head]: a copy (zeros without attention biases)"""
    @property
    def b_V(self) -> numpy.ndarray:
        """[n_layers, n_heads, d_head]: a copy (zeros without attention biases)"""
    @property
    def b_O(self) -> numpy.ndarray:
        """[n_layers, d_model]: a copy (zeros without attention biases)"""
    @property
    def W_E(self) -> numpy.ndarray:
        """[d_vocab, d_model]: a view of the token embedding (writes change the model)"""
    @property
    def W_pos(self) -> numpy.ndarray:
        """[n_ctx, d_model]: a view of the learned position embedding (read-only: the fixed table of sinusoidal positions)"""
    @property
    def W_U(self) -> numpy.ndarray:
        """[d_model, d_vocab]: a view (transposed) of the unembedding head.weight (writes change the model)"""
    @property
    def W_in(self) -> numpy.ndarray:
        """[n_layers, d_model, d_mlp]: a copy of each MLP's input weight (fc1; a gated MLP's linear half)"""
    @property
    def W_gate(self) -> numpy.ndarray:
        """[n_layers, d_model, d_mlp]: a copy of each gated MLP's gate weight (what the activation reads)"""
    @property
    def W_out(self) -> numpy.ndarray:
        """[n_layers, d_mlp, d_model]: a copy of each MLP's output weight (fc2)"""
    @property
    def b_in(self) -> numpy.ndarray:
        """[n_layers, d_mlp]: a copy (zeros without mlp_bias)"""
    @property
    def b_out(self) -> numpy.ndarray:
        """[n_layers, d_model]: a copy (zeros without mlp_bias)"""
    @property
    def b_U(self) -> object:
        """[d_vocab]: a view of the unembedding's bias (zeros, a copy, without head_bias)"""
    def head_weights(self, layer: int, head: int, grads: bool = ...) -> dict:
        """Copies of head's blocks in headlab's (out, in) layout: W_Q, W_K, W_V (d_head, d_model) and W_O (d_model, d_head) (model.W_Q[layer, head] is W_Q's transpose); grads=True: of their gradients"""
    def gates(self, layer: int) -> Tensor:
        """Head gates of a layer (H): a view to set"""
    def gate_values(self) -> numpy.ndarray:
        """Every layer's head gates (n_layers, n_heads)"""
    def add_sae(self, sae: Any, use_error_term: bool = ...) -> None:
        """Splice `sae` in at its hook point for every later run (SAELens's HookedSAETransformer.add_sae): its features, reconstruction and error become hook points (HOOK.hook_sae_input, .hook_sae_acts_pre, .hook_sae_acts_post, .hook_sae_recons, .hook_sae_error, .hook_sae_output) that run_with_cache, hooks, activation_patching (axes=['feature']) and edge_patching (its features as senders) take. use_error_term=True adds the error x - x_hat back, so the outputs are the model's own until a feature is edited; False runs the model on x_hat"""
    def reset_saes(self) -> None:
        """Detach every SAE (model.add_sae)"""
    @property
    def saes(self) -> list:
        """The attached SAEs (hl.SAE, model.add_sae), in the order attached"""
    def hook_points(self) -> List[Tuple[str, str]]:
        """(name, shape) of every hook point of this model, its attached SAEs' included (hl.hook_points(config): the config's)"""
    def run_with_cache(self, ids: object, names_filter: object = ..., incl_bwd: bool = ..., attention_mask: object = ..., return_type: object = ...) -> tuple:
        """(logits, cache): cache[name] for every hook name passing names_filter (None = all but the split q/k/v inputs, a name, a list, or a predicate name -> bool); incl_bwd=True: cache[name + '_grad'] (or cache.grad(name)) after a backward: return_type='loss' runs the loss's backward here (as TransformerLens), with 'logits' call backward() on a loss of them. The cache's decompose_resid, logit_attrs and the rest read hook_result and hook_scale, which names_filter=None caches. attention_mask, return_type: as model(...)"""
    def run_with_hooks(self, ids: object, fwd_hooks: List[Tuple[str, function]] = ..., bwd_hooks: List[Tuple[str, function]] = ..., attention_mask: object = ..., return_type: object = ...) -> object:
        """logits with hooks (after the model's own, add_hook): fn(activation, name) may return a replacement (the activation is read-only: edit a copy; an array is a constant to autograd; a hook wrapped in headlab.tensor_hook gets an hl.Tensor and its returned expression keeps the gradient); backward hooks fn(grad, name) run during backward(). attention_mask, return_type: as model(...)"""
    def add_hook(self, name: str, hook: function, dir: str = ...) -> None:
        """Keeps hook fn(activation, name) at `name` for every forward of the model until reset_hooks()"""
    def reset_hooks(self) -> None:
        """Removes every hook add_hook (or a hooks() block) left on the model"""
    def generate(self, tokens: object, max_new_tokens: int = ..., temperature: float = ..., seed: int = ..., attention_mask: object = ...) -> numpy.ndarray:
        """tokens (T) or (B, T) continued by max_new_tokens tokens (KV-cached; without hooks): temperature 0 is greedy, > 0 samples from softmax(logits / temperature), the same seed giving the same tokens. Returns (B, T + max_new_tokens) ids. Prompts of different lengths: padded on the left with their attention_mask (to_tokens(texts, padding_side='left'))"""
    @property
    def num_parameters(self) -> int:
        """How many parameters the model has"""
    def hooks(self, fwd_hooks: Any = ..., bwd_hooks: Any = ..., reset_hooks_end: Any = ...) -> Any:
        """``with model.hooks(fwd_hooks=[(name, fn)], bwd_hooks=[...]):`` every forward of the model in
the block (``model(ids)``, ``loss``, ``run_with_cache``, ``run_with_hooks``) runs the hooks.

``fn(activation, name)`` returns None or a replacement of the same shape (the activation is
read-only: edit a copy). On leaving the block the hooks added by it are removed (those added
before stay); ``reset_hooks_end=False`` keeps them until ``model.reset_hooks()``."""
    def to_tokens(self, input: Any, prepend_bos: Any = ..., padding_side: Any = ...) -> Any:
        """Token ids (1, T) of a string, or (B, T) of a list of strings.

``prepend_bos``: None = the tokenizer's BOS first when it has one (``tok.bos_token_id``: GPT-2's
``<|endoftext|>`` as TransformerLens does, a tokenizer.json's ``<s>`` or ``<|begin_of_text|>``),
none for a byte-level model; True requires that token.

``padding_side``: None = the texts must have one token length; ``"right"`` or ``"left"`` pads
the shorter ones on that side and returns ``(ids, attention_mask)`` (1 = token, 0 = padding)
for ``model(ids, attention_mask=mask)``. TransformerLens derives the mask from a pad token in
the forward; headlab returns it, since a byte-level model has no token free for padding.
Padding is the BOS token when the tokenizer has one, else id 0 (never attended to)."""
    def to_string(self, tokens: Any) -> Any:
        """The text of token ids: a str for (T) ids, a list of str for (B, T)."""
    def to_str_tokens(self, input: Any, prepend_bos: Any = ...) -> Any:
        """Each token's text: of a string (tokenized as ``to_tokens`` does) or of (T) / (1, T) ids."""
    def to_single_token(self, string: Any) -> Any:
        """The id of a string that is one token (TransformerLens's ``to_single_token``)."""
    @property
    def tokenizer(self) -> Any:
        """The model's tokenizer (hl.Tokenizer) or None: set by TransformerLM.load from a GPT-2 directory, or assigned"""
    @property
    def OV(self) -> Any:
        """Each head's OV circuit W_V @ W_O as a FactoredMatrix [n_layers, n_heads, d_model, d_model]"""
    @property
    def QK(self) -> Any:
        """Each head's QK circuit W_Q @ W_K^T as a FactoredMatrix [n_layers, n_heads, d_model, d_model]"""

@overload
def activation_patching(model: TransformerLM, task: object = ..., data: object = ..., seed: int = ..., alphabet: Optional[int] = ...) -> object:
    ...
@overload
def activation_patching(model: TransformerLM, clean: object, corrupted: object, hook: str = ..., axes: List[str] = ..., answers: object = ..., metric: object = ..., attention_mask: object = ...) -> numpy.ndarray:
    ...

def attention_statistics(model: TransformerLM, data: object) -> object:
    """A HeadStats: per head (L, H), over non-padding queries, entropy, entropy_norm, confidence, argmax_distance"""

def composition_baseline(config: ModelConfig, models: int = ..., seed: int = ...) -> object:
    """A CompositionBaseline: what composition scores random weights of config's shapes get: per kind (q, k, v) the mean and the 2.5th and 97.5th percentiles (lo, hi) over the head pairs of `models` random 2-layer models"""

def composition_scores(model: TransformerLM, layer_a: int, layer_b: int, offset: Optional[int] = ...) -> object:
    """A CompositionScores: Q/K/V composition, q, k, v [head of layer_a][head of layer_b]. On a rotary model Q- and K-composition use W_QK(offset) = (R(offset) W_Q)^T W_K at the key offset (query position - key position); offset None: their mean over offsets 0..n_ctx-1, as headlab compose. V-composition is never rotated; other models score the same at every offset"""

def copying_score(model: TransformerLM, layer: int, head: int) -> float:
    """Re(sum of the OV circuit's eigenvalues) / sum of their |.|: 1 copies, -1 suppresses (Elhage et al. 2021)"""

def corrupt_one_symbol(task: Task, data: Batches, seed: int = ..., corrupt: str = ...) -> object:
    """A PatchingInputs: the patching inputs activation_patching(model, task, data) makes from the first batch: clean and corrupted ids (R, T), answers (R, 4) of (row, pos, clean token, corrupted token), source_pos (R): the position changed. corrupt='source' changes the answer's earlier occurrence, 'previous' the token before it (which the answer follows)"""

def cross_entropy(logits: Tensor, targets: object) -> Tensor:
    """Mean cross-entropy of (B, T, V) logits over targets != -1"""

def detect_heads(model: TransformerLM, data: object, kind: str = ..., exclude_bos: bool = ..., exclude_current_token: bool = ...) -> numpy.ndarray:
    """TransformerLens-style detector scores (L, H): previous_token, duplicate_token or induction"""

def edge_patching(model: TransformerLM, clean: object, corrupted: object, *, answers: object, method: str = ..., ig_steps: int = ..., ig_interpolate: str = ..., acdc_threshold: float = ..., acdc_score: str = ..., target_edges: object = ..., prune_steps: int = ..., prune_lr: float = ..., attention_mask: object = ...) -> object:
    """An EdgeResult: exact edge patching and edge attribution of every edge (as headlab edges), senders and receivers (names, in edge order), exact, attribution and linearisation_error (attribution - exact) arrays, clean_metric and corrupted_metric (mean logit difference of the answers (row, pos, clean token, corrupted token)). method='eap-ig' (ig_steps, ig_interpolate 'inputs' or 'activations'), 'atp-star' (AtP*: the QK fix and GradDrop), 'acdc' (acdc_threshold, acdc_score 'metric' or 'kl') or 'edge-pruning' (target_edges, default 20 or every edge; prune_steps, prune_lr) adds that method's scores under its name (acdc, edge-pruning: also 'circuit', the kept edges, and 'circuit_edges', their names with the kept MLP-sender edges 'mlp{l}->receiver'), as headlab edges --method. attention_mask (B, T), 1 = token, 0 = padding: rows of different lengths padded on either side, one mask for both runs, each row measured as if alone (answers' pos in the padded columns given). A grouped-query model (n_kv_heads < n_heads) runs ungrouped: L{l}H{h}.k/.v is query head h's own copy of its group's key/value input. With SAEs on hook_z attached (model.add_sae), their features that differ between the runs and each SAE's error are senders too: feature_senders ('L1z.f17', 'L1z.err'), feature_receivers, feature_exact and feature_attribution"""

def evaluate(model: TransformerLM, task: object = ..., data: object = ..., autoregressive: bool = ...) -> object:
    """An EvalResult: held-out loss, token_acc, exact_match (and ar_exact_match with autoregressive=True) over the data's counted targets"""

def evaluate_sae(model: TransformerLM, sae: SAE, data: object) -> object:
    """The SAE measured on model over data (what hl.Batches takes: token ids (N, T), next-token targets): a dict of
l0, explained_variance, mse, dead_fraction, dense_fraction, density (per feature) and density_histogram (log10
buckets) on the activations at the SAE's hook, and the loss recovered when its reconstruction is spliced in:
loss_clean, loss_spliced, loss_zero_ablated, loss_recovered = (zero_ablated - spliced) / (zero_ablated - clean).
The same numbers as `headlab sae`'s metrics.json."""

def feature_ablation(model: TransformerLM, sae: SAE, data: object, features: List[int], keep_error: bool = ...) -> dict:
    """Each feature's ablation effect on the loss: the SAE spliced in at its hook with the feature set to 0, minus nothing ablated. keep_error adds the SAE's error back (the base is then the model itself)."""

def feature_attribution(model: TransformerLM, sae: SAE, ids: object, feature: int, attention_mask: object = ...) -> dict:
    """Direct feature attribution by source position for an SAE on hook_z: the feature's pre-activation at every query decomposed over heads and attended source tokens, contribution (B, T, H, T) [b, query, head, source], plus bias; contribution.sum((2, 3)) + bias == pre_activation. attention_mask (B, T), 1 = token, 0 = padding on either side of a row's tokens: each row as alone, in its columns; a padding query has no contribution and NaN activations."""

def feature_final_scale(model: TransformerLM, data: object) -> float:
    """The mean of ln_final.hook_scale over the tokens of data, padding left out (1 without a final norm)"""

def feature_head_outputs(model: TransformerLM, sae: SAE) -> numpy.ndarray:
    """For an SAE on blocks.L.attn.hook_z: each feature's decoder block of head h through head h's W_O, (d_sae, n_heads, d_model): what one unit of the feature writes into the residual stream through each head."""

def feature_logit_effects(model: TransformerLM, sae: SAE, features: List[int], scale: float = ..., top_k: int = ...) -> list:
    """Each feature's direct effect on the logits per unit of activation: its output through W_O, ln_final with the fixed `scale` (feature_final_scale gives the data's mean) and W_U. A list of {feature, logits (vocab), promoted, suppressed}."""

def feature_presence(model: TransformerLM, sae: SAE, data: object) -> dict:
    """Each feature's mean activation and firing frequency over every token of data (apply it to each snapshot of a run to follow the features over training)"""

def get_act_name(name: str, layer: Optional[int] = ..., layer_type: str = ...) -> str:
    """A hook's full name from TransformerLens's short form: get_act_name('pattern', 0) = 'blocks.0.attn.hook_pattern'"""

def grad_enabled() -> bool:
    """Whether ops record a graph now (False inside headlab.no_grad())"""

def head_analyses() -> list:
    """The per-head analyses of scores_over_training (and `headlab COMMAND --run`), one HeadAnalysis per analysis: name, command, scores (the names of the grids it returns), help, default_examples"""

def head_gradient_norms(model: TransformerLM) -> object:
    """A HeadGradientNorms: the gradient atlas of the current gradients, per-head Frobenius norms (L, H or H_kv) of grads and weights"""

def head_importance(model: TransformerLM, data: object, normalize: bool = ...) -> numpy.ndarray:
    """Michel et al. (2019) importance (L, H): the mean over examples of |dL(x)/d gate_h|, L(x) the example's mean loss"""

def head_importance_per_token(model: TransformerLM, data: object, normalize: bool = ...) -> numpy.ndarray:
    """Token-level importance (L, H): |z_h . dL/dz_h| summed over non-padding positions over the counted targets, L the summed loss"""

def hook_points(config: ModelConfig) -> List[Tuple[str, str]]:
    """(name, shape) of every hook point of a model of this config, in forward order"""

def hungarian(cost: List[List[float]]) -> List[int]:
    """Optimal assignment of rows to distinct columns minimising the summed cost; -1 for rows left out (more rows than columns)"""

def live_tensors() -> int:
    """Tensors alive now (for leak checks)"""

def load_safetensors(path: str | os.PathLike) -> dict:
    """The tensors of a safetensors file as NumPy arrays, {name: array}: float32 (F32, BF16 and F16 read exactly), int32 (I32, I64); e.g. the inputs.safetensors patch and edges write"""

def match_heads(model_a: TransformerLM, model_b: TransformerLM, data: object = ..., by: str = ..., across_layers: bool = ..., examples: int = ..., seed: int = ...) -> object:
    """Heads of model_a matched one to one to heads of model_b (Hungarian assignment) by attention pattern on data (default: the varied repeat probe) or by QK/OV circuit weights; a HeadMatch: pairs (layer_a, head_a, layer_b, head_b, similarity), unmatched_a, unmatched_b, similarity (heads of A x heads of B, layer-major) and mean_similarity"""

def match_sae_features(a: SAE, b: SAE) -> dict:
    """a's features matched one to one with b's by decoder cosine (Hungarian): {partner (b's feature per a's, -1 = none), cosine, mean_cosine}"""

def mean_activation(model: TransformerLM, data: object, hook: str, per_position: bool = ...) -> Tensor:
    """Mean of a hook's activation over the data's rows (and positions unless per_position): its shape with those axes of size 1"""

def num_threads() -> int:
    """Threads of the C++ kernels"""

def ov_eigenvalues(model: TransformerLM, layer: int, head: int) -> numpy.ndarray:
    """The d_head eigenvalues (complex) of the head's full OV circuit W_U W_O W_V W_E (layer norm weights folded in); the other vocab - d_head are 0"""

def ov_singular_values(model: TransformerLM, layer: int, head: int) -> List[float]:
    """Singular values (descending) of the head's OV circuit W_O W_V (d_model x d_model, rank <= d_head)"""

def path_patching(model: TransformerLM, clean: object, corrupted: object, *, sender: str, receivers: object = ..., answers: object, attention_mask: object = ...) -> object:
    """A PathPatchingResult: path patching of sender (embed or L{l}H{h}) to receivers (names; default: every reader): path = metric of the clean run with every receiver reading its input + the sender's corrupted-minus-clean output, minus the clean metric; activation = the same for the sender's whole output patched; clean_metric, corrupted_metric. attention_mask: as edge_patching's"""

def per_token_loss(model: TransformerLM, ids: object, targets: object = ...) -> numpy.ndarray:
    """Cross-entropy at each position: targets None = next token, (B, T-1); else (B, T) with 0 where the target is -1"""

def permute_heads(model: TransformerLM, layer: int, perm: List[int]) -> None:
    """Reorder the heads of a layer in place (new head h = old head perm[h]); the model computes the same function"""

class precision:
    """Context manager: inside `with hl.precision("bf16"):` the linear layers' products take bf16 operands with float32 accumulation (norms, softmax, the residual stream stay float32), on this thread. For forward-only studies of large models; results are approximate (a warning says so). Needs a CPU with AVX512_BF16. precision("float32") restores the default inside an outer bf16 block."""
    def __init__(self, precision: str) -> None:
        """Makes the block; precision is float32 or bf16"""
    @property
    def name(self) -> str:
        """The precision: float32 or bf16"""

def prune_curve(model: TransformerLM, task: object = ..., data: object = ..., order: str = ..., step_fraction: float = ..., min_per_layer: int = ..., recompute: bool = ..., seed: int = ...) -> object:
    """A PruneCurve: accuracy as heads are removed in an order (on a copy; the model is unchanged)"""

def qk_attribution(model: TransformerLM, ids: object, *, row: int = ..., layer: int, head: int, query: object = ..., key: object = ..., answers: object = ..., source_pos: object = ..., key_rule: str = ..., aggregate: str = ...) -> object:
    """A QkAttribution: head (layer, head)'s scaled attention score split into pairs of upstream components (tok, pos, earlier heads L{l}H{h}, L{l}.b_O, mlp{l}, bias) through ln1 with its scale frozen (QK-norm's too; rotary parts turned by their position). One site: query and key of ids' row. A task's sites (as headlab qk): answers (rows of (row, pos, ...): query = pos) with key_rule 'source' (source_pos, the answer's earlier occurrence, as hl.corrupt_one_symbol gives), 'previous' or 'max', the pairs' aggregate ('mean' or 'sum') over the sites. Fields: components (names), pairs (C, C) [query side, key side], score (the model's, aggregated the same way: the pairs sum to it), query_totals and key_totals (C), sites (S, 3) of (row, query, key), aggregate, layer, head"""

def qk_singular_values(model: TransformerLM, layer: int, head: int, offset: Optional[int] = ...) -> List[float]:
    """Singular values (descending) of the head's QK circuit W_Q^T W_K (d_model x d_model, rank <= d_head). On a rotary model those of W_QK(offset) = (R(offset) W_Q)^T W_K; offset None: the mean of each over offsets 0..n_ctx-1, as the gradient atlas's circuits.csv"""

def repeated_random_tokens(n: int, k: int, vocab: int, seed: int = ...) -> Batches:
    """The fixed probe: n sequences [r_1..r_k, r_1..r_k] of uniform random tokens (every repeat k back)"""

def set_num_threads(n: int) -> None:
    """Threads of the C++ kernels from now on"""

def single_head_ablation(model: TransformerLM, task: object = ..., data: object = ...) -> object:
    """An AblationResult: the change in held-out loss/accuracy when each head alone is zero- or mean-ablated, arrays (L, H)"""

def softmax(x: Tensor, axis: int = ...) -> Tensor:
    """Softmax along axis (differentiable)"""

def tensor(array: numpy.ndarray, requires_grad: bool = ...) -> Tensor:
    """A float32 copy of a float array (float64 is rounded to float32); never a view"""

def top_activating_examples(model: TransformerLM, sae: SAE, data: object, features: List[int], k: int = ..., before: int = ..., after: int = ...) -> list:
    """Per feature, the k rows of data where it is largest, each as the window of tokens around its largest token with the feature's activation at each: [{feature, examples: [{row, position, max_activation, window_start, tokens, activations}]}]"""

def train_sae(model: TransformerLM, hook: str, data: object, architecture: str = ..., expansion: int = ..., k: int = ..., steps: int = ..., batch: int = ..., lr: float = ..., warmup: int = ..., buffer: int = ..., l1_coefficient: float = ..., l0_coefficient: float = ..., bandwidth: float = ..., seed: int = ..., hook_out: object = ..., sparsity_warmup: int = ..., lr_decay_steps: int = ..., jumprelu_sparsity: str = ..., tanh_scale: float = ..., pre_act_coefficient: float = ..., out: object = ..., resume: bool = ..., snapshot_every: int = ..., normalize_activations: object = ...) -> SAE:
    """Trains an SAE on model's activations at hook (e.g. "blocks.1.attn.hook_z", heads concatenated) over data,
token ids (B, T), hl.Batches (a task's held_out, or arrays with an attention_mask: padding is never an activation) or
a dict of arrays, run through the model and mixed in a shuffle buffer of `buffer` rows. Returns an SAE.
With hook_out, a transcoder from hook's activation to hook_out's (e.g. hook="blocks.0.ln2.hook_normalized",
hook_out="blocks.0.hook_mlp_out": the MLP's input to its output). sparsity_warmup: steps over which the L1 (standard)
or L0 (jumprelu) weight rises from 0; lr_decay_steps: final steps over which the learning rate falls to 0.
jumprelu_sparsity: "step" (the L0 through a straight-through step) or "tanh" (sum of tanh(tanh_scale f |W_dec|));
pre_act_coefficient: weight of the dead features' relu(threshold - pre) |W_dec| (0: off).
normalize_activations: "none" or "layer_norm" (each row centred and scaled to unit std before the encoder, scaled
back after the decoder, SAELens's name); None: layer_norm for batchtopk, none for the others.
With out, a run directory as `headlab sae --out` writes: sae_state.safetensors (Ctrl-C saves it too), snapshots/stepN
every snapshot_every steps, and at the end cfg.json, sae_weights.safetensors and metrics.json (on data);
resume=True continues it bit for bit (same settings, steps may grow)."""

def train_settings() -> list:
    """(keyword, flag, help) of every training setting"""

def varied_repeat_probe(n: int, k_max: int, vocab: int, seed: int = ..., bos: int = ...) -> Batches:
    """The probe position cannot fool: rows of 2 k_max random tokens with a block of k_max/2..k_max tokens repeated at a random place (detect's default)"""
