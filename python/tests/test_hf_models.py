"""Hugging Face directories of today's architectures (gpt_neox, llama, mistral, qwen2, qwen3, gpt_neo,
gemma2, gemma3_text) read by headlab: tiny random models written by scripts/reference/hf_modern.py (from each
architecture's published modeling code) load through `hl.TransformerLM.load` and `headlab convert`
with logits equal to the reference's float64 forward within 1e-4 relative, also from BF16, F16 and
sharded files; what headlab cannot represent is refused in one line naming the field or tensor."""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (Debian's python3-torch)")
hl = pytest.importorskip("headlab")

HEADLAB = os.environ.get("HEADLAB_BINARY", "headlab")
SCRIPTS = os.path.join(os.environ.get("HEADLAB_SOURCE_DIR", "."), "scripts")
sys.path.insert(0, os.path.join(SCRIPTS, "reference"))
import hf_modern as ref  # noqa: E402


def run(*args):
    return subprocess.run([HEADLAB, *map(str, args)], capture_output=True, text=True)


def ids_for(vocab, T=11, B=2, seed=5):
    return np.random.default_rng(seed).integers(0, vocab, size=(B, T)).astype(np.int64)


def headlab_logits(path, ids):
    return np.asarray(hl.TransformerLM.load(str(path))(ids.astype(np.int32)), dtype=np.float64)


def assert_close(got, want):
    # within 1e-4 of the logits' scale: float32 arithmetic against a float64 reference
    scale = np.abs(want).max()
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= 1e-4 * scale, np.abs(got - want).max() / scale


def make(tmp_path, name, dtype=torch.float32, shards=1, config=None, seed=0):
    config = dict(ref.CONFIGS[name], **(config or {}))
    state = ref.random_state(config, seed=seed)
    d = tmp_path / f"{name}-{str(dtype).split('.')[-1]}-{shards}"
    ref.write_hf(str(d), config, state, dtype, shards)
    # what the file holds: the state rounded to its dtype
    return d, config, ref.widen(ref.narrow(state, dtype))


@pytest.mark.parametrize("name", sorted(ref.CONFIGS))
def test_logits_match_the_reference(tmp_path, name):
    d, config, state = make(tmp_path, name)
    ids = ids_for(config["vocab_size"])
    assert_close(headlab_logits(d, ids), ref.forward(config, state, ids).numpy())


@pytest.mark.parametrize("name,dtype,shards", [("pythia", torch.bfloat16, 1), ("smollm2", torch.bfloat16, 3),
                                               ("gemma2", torch.bfloat16, 2), ("qwen3", torch.float16, 1),
                                               ("gemma3", torch.bfloat16, 1),
                                               ("tinystories", torch.float32, 2)])
def test_bf16_f16_and_sharded_files_load(tmp_path, name, dtype, shards):
    d, config, state = make(tmp_path, name, dtype, shards)
    ids = ids_for(config["vocab_size"])
    assert_close(headlab_logits(d, ids), ref.forward(config, state, ids).numpy())
    # BF16/F16 values widen exactly: headlab's embedding is the file's, bit for bit
    m = hl.TransformerLM.load(str(d))
    emb = next(v for k, v in state.items() if k.endswith(("embed_in.weight", "embed_tokens.weight", "wte.weight")))
    assert np.array_equal(np.asarray(m.named_parameters()["tok_emb.weight"]), emb)


def test_convert_writes_a_checkpoint_with_the_same_logits(tmp_path):
    d, config, state = make(tmp_path, "pythia")
    out = tmp_path / "pythia.safetensors"
    r = run("convert", d, "--out", out)
    assert r.returncode == 0, r.stderr
    ids = ids_for(config["vocab_size"])
    assert_close(headlab_logits(out, ids), ref.forward(config, state, ids).numpy())
    assert np.array_equal(headlab_logits(out, ids), headlab_logits(d, ids))


def test_commands_take_an_hf_dir(tmp_path):
    d, _, _ = make(tmp_path, "smollm2")
    r = run("detect", "--checkpoint", d, "--examples", 4, "--length", 4, "--out", tmp_path / "det")
    assert r.returncode == 0, r.stderr


def bad_line(r):
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    return lines[0]


def edit_config(d, **changes):
    c = json.load(open(d / "config.json"))
    c.update(changes)
    json.dump(c, open(d / "config.json", "w"))


@pytest.mark.parametrize("name,changes,expect", [
    ("smollm2", {"model_type": "mixtral"}, "model_type \"mixtral\" is not an architecture headlab reads"),
    ("smollm2", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "'rope_scaling' of type \"llama3\" is not supported"),
    ("smollm2", {"hidden_size": 32}, "has shape (29,24) but config.json"),
    ("smollm2", {"num_key_value_heads": 4}, "self_attn.k_proj.weight' has shape (12,24)"),
    ("qwen2", {"use_sliding_window": True}, "'use_sliding_window' true"),
    ("smollm2", {"tie_word_embeddings": False}, "missing tensor 'lm_head.weight' that config.json needs"),
    ("smollm2", {"num_hidden_layers": 1}, "unexpected tensor 'model.layers.1.input_layernorm.weight'"),
    ("pythia", {"hidden_act": "gelu_fast"}, "'hidden_act' \"gelu_fast\" is not an activation headlab has"),
    ("tinystories", {"attention_types": [[["global", "local"], 2]]}, "'attention_types' describes 4 layers but num_layers is 2"),
    ("gemma2", {"num_hidden_layers": 4}, "missing tensor 'model.layers.3.input_layernorm.weight'"),
    ("gemma3", {"rope_scaling": {"rope_type": "linear", "factor": 8.0}}, "'rope_scaling' of type \"linear\" is not supported"),
    ("gemma3", {"use_bidirectional_attention": True}, "'use_bidirectional_attention' true (an encoder"),
    ("gemma3", {"sliding_window_pattern": 0}, "'sliding_window_pattern' must be an integer in 1..1024, got 0"),
])
def test_refusals_name_the_field(tmp_path, name, changes, expect):
    d, _, _ = make(tmp_path, name)
    edit_config(d, **changes)
    out = tmp_path / "out.safetensors"
    line = bad_line(run("convert", d, "--out", out))
    assert expect in line, line
    assert not out.exists()


def test_truncated_shard_is_refused(tmp_path):
    d, _, _ = make(tmp_path, "smollm2", shards=2)
    shard = d / "model-00002-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-10])
    out = tmp_path / "out.safetensors"
    line = bad_line(run("convert", d, "--out", out))
    assert "model-00002-of-00002.safetensors: not a valid safetensors file" in line and "truncated" in line, line
    assert not out.exists()


def test_bf16_tensor_with_the_wrong_byte_count_is_refused(tmp_path):
    d, _, _ = make(tmp_path, "pythia", torch.bfloat16)
    data = bytearray((d / "model.safetensors").read_bytes())
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    e = header["gpt_neox.final_layer_norm.bias"]
    e["shape"] = [e["shape"][0] + 1]  # one element more than its bytes hold
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    (d / "model.safetensors").write_bytes(len(h).to_bytes(8, "little") + h + bytes(data[8 + n:]))
    out = tmp_path / "out.safetensors"
    line = bad_line(run("convert", d, "--out", out))
    assert "tensor 'gpt_neox.final_layer_norm.bias': shape (33) of BF16 needs 66 bytes but data_offsets span 64" in line, line
    assert not out.exists()


# ---------- a model's revisions (stepN subdirectories) as a run ----------

def read_csv(path):
    import csv
    return list(csv.DictReader(open(path)))


def three_revisions(run_dir):
    """DIR/step0, DIR/step512, DIR/step1000: three revisions of a Pythia-shaped model, as downloaded."""
    for seed, step in enumerate([1000, 0, 512]):
        config = ref.CONFIGS["pythia"]
        ref.write_hf(str(run_dir / f"step{step}"), config, ref.random_state(config, seed=seed), torch.bfloat16)
    return run_dir


def test_revision_directories_are_a_run(tmp_path):
    # three revisions of a Pythia-shaped model, as downloaded: DIR/step0, DIR/step512, DIR/step1000
    run_dir = three_revisions(tmp_path / "pythia-revisions")
    over = tmp_path / "over"
    r = run("detect", "--run", run_dir, "--examples", 8, "--out", over)
    assert r.returncode == 0, r.stderr
    rows = read_csv(over / "detect_over_training.csv")
    assert sorted({int(x["step"]) for x in rows}) == [0, 512, 1000]
    py = hl.scores_over_training(str(run_dir), analysis="detect", examples=8)
    assert list(py["steps"]) == [0, 512, 1000]
    for step in (0, 512, 1000):
        one = tmp_path / f"one-{step}"
        r = run("detect", "--checkpoint", run_dir / f"step{step}", "--examples", 8, "--out", one)
        assert r.returncode == 0, r.stderr
        for o in read_csv(one / "detect.csv"):
            x = next(x for x in rows if (int(x["step"]), x["layer"], x["head"]) == (step, o["layer"], o["head"]))
            for name in ("previous_token", "duplicate_token", "induction"):
                assert "%.6f" % float(x[name]) == o[name], (step, name, o)


def test_revisions_are_patched_on_the_probe(tmp_path):
    # a downloaded model names no task: patch --run --data probe (and Python's data="probe") patch the repeat
    # probe at every revision, equal to patch --data probe on each
    run_dir = three_revisions(tmp_path / "pythia-revisions")
    over = tmp_path / "over"
    r = run("patch", "--run", run_dir, "--data", "probe", "--length", 4, "--examples", 4, "--out", over)
    assert r.returncode == 0, r.stderr
    rows = read_csv(over / "patch_over_training.csv")
    py = hl.scores_over_training(str(run_dir), analysis="patch", data="probe", length=4, examples=4, quiet=True)
    assert list(py["steps"]) == [0, 512, 1000]
    one = tmp_path / "one-512"
    r = run("patch", "--checkpoint", run_dir / "step512", "--data", "probe", "--length", 4, "--examples", 4, "--out", one)
    assert r.returncode == 0, r.stderr
    for o in read_csv(one / "patch_heads.csv"):
        x = next(x for x in rows if (int(x["step"]), x["layer"], x["head"]) == (512, o["layer"], o["head"]))
        assert float(x["exact"]) == pytest.approx(float(o["exact"]), abs=1e-6), o
        assert py["scores"]["exact"][1, int(o["layer"]), int(o["head"])] == pytest.approx(float(o["exact"]), abs=1e-6)


def test_match_takes_revisions(tmp_path):
    # DIR/stepN is one revision; DIR alone is its last, as a run directory is its final checkpoint
    run_dir = three_revisions(tmp_path / "pythia-revisions")
    a = run("match", "--checkpoint", run_dir / "step0", "--checkpoint", run_dir, "--examples", 8, "--out", tmp_path / "a")
    assert a.returncode == 0, a.stderr
    assert f"heads of A ({run_dir / 'step0'}) matched to heads of B ({run_dir / 'step1000'})" in a.stdout, a.stdout
    b = run("match", "--checkpoint", run_dir / "step0", "--checkpoint", run_dir / "step1000", "--examples", 8,
            "--out", tmp_path / "b")
    assert b.returncode == 0, b.stderr
    assert (tmp_path / "a" / "match.csv").read_bytes() == (tmp_path / "b" / "match.csv").read_bytes()
    # revisions of one run share the residual basis: weights matching applies; a model matched with itself is the identity
    w = run("match", "--checkpoint", run_dir / "step512", "--checkpoint", run_dir / "step512", "--by", "weights",
            "--out", tmp_path / "w")
    assert w.returncode == 0, w.stderr
    for row in read_csv(tmp_path / "w" / "match.csv"):
        assert (row["layer_a"], row["head_a"]) == (row["layer_b"], row["head_b"]) and abs(float(row["similarity"]) - 1) < 1e-5, row


def test_match_over_the_steps_of_revisions(tmp_path):
    # --run DIR: every step against the last, each step's rows those of match --checkpoint DIR/stepN --checkpoint DIR
    run_dir = three_revisions(tmp_path / "pythia-revisions")
    r = run("match", "--run", run_dir, "--examples", 8, "--out", tmp_path / "over")
    assert r.returncode == 0, r.stderr
    rows = (tmp_path / "over" / "match_over_training.csv").read_text().splitlines()
    assert rows[0] == "step,layer_a,head_a,role_a,layer_b,head_b,role_b,similarity"
    summary = json.loads((tmp_path / "over" / "match_over_training.json").read_text())
    assert [s["step"] for s in summary["steps"]] == [0, 512] and summary["against_step"] == 1000
    for step in (0, 512):
        one = tmp_path / f"one-{step}"
        r = run("match", "--checkpoint", run_dir / f"step{step}", "--checkpoint", run_dir, "--examples", 8, "--out", one)
        assert r.returncode == 0, r.stderr
        pairwise = (one / "match.csv").read_text().splitlines()[1:]
        assert [x.split(",", 1)[1] for x in rows[1:] if x.startswith(f"{step},")] == pairwise
        assert json.loads((one / "match.json").read_text())["mean_similarity"] == \
            next(s for s in summary["steps"] if s["step"] == step)["mean_similarity"]
    bad = run("match", "--run", run_dir / "step0", "--out", tmp_path / "bad")
    assert bad.returncode != 0 and "no revision subdirectories" in bad.stderr, bad.stderr


def test_view_of_revisions_shows_the_heads_over_training(tmp_path):
    run_dir = three_revisions(tmp_path / "pythia-revisions")
    r = run("detect", "--run", run_dir, "--examples", 8)  # into DIR/over_training/detect, where the page looks
    assert r.returncode == 0, r.stderr
    page = tmp_path / "page.html"
    r = run("view", run_dir, "--examples", 2, "--out", page)
    assert r.returncode == 0, r.stderr
    assert f"showing the last, {run_dir / 'step1000'}" in r.stderr
    # the panel's data in the page: the CSV detect wrote, 3 steps x 2 layers x 2 heads
    html = page.read_text()
    at = html.index('"over_training":') + len('"over_training":')
    over, _ = json.JSONDecoder().raw_decode(html[at:])
    assert [o["analysis"] for o in over] == ["detect"]
    columns, got = over[0]["table"]["columns"], over[0]["table"]["rows"]
    want = read_csv(run_dir / "over_training" / "detect" / "detect_over_training.csv")
    assert sorted({row[columns.index("step")] for row in got}) == [0, 512, 1000] and len(got) == len(want) == 12
    for row, x in zip(got, want):
        assert [row[columns.index(c)] for c in columns] == [float(x[c]) for c in columns], (row, x)


# ---------- out: headlab export --format hf ----------

LAYOUT = {"pythia": "gpt_neox", "neox_sequential": "gpt_neox", "smollm2": "llama", "llama_untied": "llama",
          "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3", "tinystories": "gpt_neo", "gemma2": "gemma2",
          "gemma3": "gemma3_text", "gemma3_types": "gemma3_text"}


@pytest.mark.parametrize("name", sorted(ref.CONFIGS))
def test_export_writes_the_layout_back_bit_for_bit(tmp_path, name):
    d, config, state = make(tmp_path, name)
    first = tmp_path / "first.safetensors"
    assert run("convert", d, "--out", first).returncode == 0
    out = tmp_path / "exported"
    r = run("export", first, "--format", "hf", "--out", out)
    assert r.returncode == 0, r.stderr
    assert f"({LAYOUT[name]} layout" in r.stdout, r.stdout
    # the layout's own tensors, every one as the original file holds it
    exported_config, exported = ref.read_hf(str(out))
    assert exported_config["model_type"] == config["model_type"]
    assert sorted(exported) == sorted(state)
    for k in state:
        assert np.array_equal(exported[k], state[k]), k
    # the reference forward of the exported files gives headlab's logits
    ids = ids_for(config["vocab_size"])
    assert_close(headlab_logits(first, ids), ref.forward(exported_config, exported, ids).numpy())
    # and convert reads them back bit for bit
    again = tmp_path / "again.safetensors"
    assert run("convert", out, "--out", again).returncode == 0
    a, b = hl.TransformerLM.load(str(first)).named_parameters(), hl.TransformerLM.load(str(again)).named_parameters()
    assert sorted(a) == sorted(b)
    for k in a:
        assert np.array_equal(np.asarray(a[k]), np.asarray(b[k])), k


@pytest.mark.parametrize("name,fmt,expect", [
    ("pythia", "hf-gpt_neo", "the gpt_neo layout cannot express the model's positions rotary (the layout gives learned)"),
    ("smollm2", "hf-gpt_neox", "the gpt_neox layout cannot express the model's mlp swiglu"),
    ("qwen3", "hf-qwen2", "the qwen2 layout cannot express the model's qk_norm 1"),
    ("mistral", "hf-llama", "the llama layout cannot express the model's sliding_window 4,4"),
    ("gemma2", "hf-gemma3_text", "the gemma3_text layout cannot express the model's qk_norm 0 (the layout gives 1)"),
    # the local layers' own rotary base: Gemma 2's layout has one base for every layer
    ("gemma3", "hf-gemma2", "the gemma2 layout cannot express the model's rope_theta 10,10,1000000,10,10,1000000,10"),
])
def test_export_refuses_what_the_layout_cannot_express(tmp_path, name, fmt, expect):
    d, _, _ = make(tmp_path, name)
    out = tmp_path / "exported"
    line = bad_line(run("export", d, "--format", fmt, "--out", out))
    assert expect in line, line
    assert not out.exists()


def test_export_refuses_an_attention_only_model(tmp_path):
    ck = tmp_path / "attn_only.safetensors"
    hl.TransformerLM(hl.ModelConfig(d_ff=0, positions="rotary", normalization="rmsnorm"), seed=1).save(str(ck))
    line = bad_line(run("export", ck, "--format", "hf", "--out", tmp_path / "x"))
    assert "no Hugging Face layout expresses the model" in line and "d_ff 0" in line, line


def test_a_tokenizer_larger_than_the_model_is_refused_at_load(tmp_path):
    # its ids past the model's vocabulary would not embed: said at load, naming the directory, by both doors;
    # convert says where the tokenizer stays (the checkpoint holds the weights alone)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import hf_tokenizer_files as files
    files.write("neox", str(tmp_path / "tok"))
    vocab = hl.Tokenizer.load(str(tmp_path / "tok")).vocab_size
    d, _, _ = make(tmp_path, "pythia", config={"vocab_size": vocab - 1})
    (d / "tokenizer.json").write_bytes((tmp_path / "tok" / "tokenizer.json").read_bytes())
    want = f"the tokenizer in {d}: its vocabulary has {vocab} tokens, more than the model's {vocab - 1}"
    with pytest.raises(ValueError, match=re.escape(want)):
        hl.TransformerLM.load(str(d))
    r = run("dla", "--checkpoint", d, "--text", "the quick fox")
    assert r.returncode != 0 and want in r.stderr, r.stderr
    r = run("convert", d, "--out", tmp_path / "c.safetensors")
    assert r.returncode == 0 and f"the tokenizer stays in {d}: give --tokenizer {d}" in r.stdout, r.stdout + r.stderr


def test_export_copies_the_tokenizer_files(tmp_path):
    # a model directory with its tokenizer: the export carries tokenizer.json, tokenizer_config.json and
    # special_tokens_map.json byte for byte, so the exported directory tokenizes as the source does
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import hf_tokenizer_files as files
    files.write("neox", str(tmp_path / "tok"))
    vocab = hl.Tokenizer.load(str(tmp_path / "tok")).vocab_size
    d, _, _ = make(tmp_path, "pythia", config={"vocab_size": vocab})
    (d / "tokenizer.json").write_bytes((tmp_path / "tok" / "tokenizer.json").read_bytes())
    (d / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<|endoftext|>", "tokenizer_class": "GPTNeoXTokenizer"}))
    (d / "special_tokens_map.json").write_text(json.dumps({"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"}))
    out = tmp_path / "exported"
    r = run("export", d, "--out", out)
    assert r.returncode == 0, r.stderr
    names = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
    for name in names:
        assert (out / name).read_bytes() == (d / name).read_bytes(), name
        assert f"copied the tokenizer file {name}" in r.stdout
    text = "Heads over training: the quick fox, 1234!"
    src, again = hl.TransformerLM.load(str(d)), hl.TransformerLM.load(str(out))
    assert again.to_tokens(text).tolist() == src.to_tokens(text).tolist()
    assert again.to_tokens(text)[0, 0] == 0  # tokenizer_config.json's bos_token came along
    # a link to a file outside the source directory is never copied out of its place
    d2 = tmp_path / "linked"
    d2.mkdir()
    for name in ("config.json", "model.safetensors"):
        (d2 / name).write_bytes((d / name).read_bytes())
    (d2 / "tokenizer.json").symlink_to(tmp_path / "tok" / "tokenizer.json")
    line = bad_line(run("export", d2, "--out", tmp_path / "x"))
    assert "tokenizer.json: is a symbolic link to" in line and "outside" in line, line
    assert not (tmp_path / "x").exists()


def test_a_model_larger_than_memory_is_refused_before_its_weights_are_read(tmp_path):
    # config.json describes a model of 5e13 parameters: refused from the config alone, with the
    # estimate (4 bytes a parameter, float32 once, and the largest tensor once more while it moves
    # into the model), before the (tiny) weights are read
    d, _, _ = make(tmp_path, "smollm2")
    D, L, Fi, V = 16384, 1024, 1 << 20, 29
    edit_config(d, hidden_size=D, num_hidden_layers=L, intermediate_size=Fi, num_attention_heads=4, num_key_value_heads=2)
    Hkv = 2 * (D // 4)
    params = 2 * V * D + L * (2 * D + D * D + 2 * Hkv * D + D * D + 3 * Fi * D) + D  # the unembedding is its own matrix
    out = tmp_path / "out.safetensors"
    for r in (run("convert", d, "--out", out), run("detect", "--checkpoint", d, "--out", tmp_path / "det")):
        line = bad_line(r)
        m = re.search(r": loading the model config.json describes \((\d+) parameters\): needs about ([\d.]+) TiB of memory, "
                      r"more than the .* available$", line)
        assert m and int(m.group(1)) == params, line
        assert abs(float(m.group(2)) - (4 * params + 4 * Fi * D) / 2 ** 40) <= 0.05, line  # printed to 0.1 TiB
    assert not out.exists() and not (tmp_path / "det").exists()


def test_edges_takes_the_repeat_probe_of_patch_on_an_hf_dir(tmp_path):
    # a Hugging Face directory has no task: `headlab edges --data probe` takes patch's repeat probe,
    # the rows it wrote are the probe's (one token of each row corrupted, the answer its copy), and
    # Python's edge_patching on them gives the command's numbers bit for bit
    from test_edges import read_int32_safetensors
    d, _, _ = make(tmp_path, "smollm2")
    out = tmp_path / "edges"
    r = run("edges", "--checkpoint", d, "--data", "probe", "--length", 4, "--rows", 3, "--threads", 2, "--out", out)
    assert r.returncode == 0, r.stderr
    assert "3 answers of the repeat probe (one source token corrupted per row)" in r.stdout
    inp = read_int32_safetensors(out / "inputs.safetensors")
    clean, corrupted, answers = inp["clean"], inp["corrupted"], inp["answers"]
    assert clean.shape == corrupted.shape == (3, 8) and answers.shape == (3, 4)
    for row, pos, good, bad in answers:
        (changed,) = np.nonzero(clean[row] != corrupted[row])
        assert len(changed) == 1 and changed[0] < pos
        assert (clean[row, changed[0]], corrupted[row, changed[0]]) == (good, bad)
    j = json.load(open(out / "edges.json"))
    py = hl.edge_patching(hl.TransformerLM.load(str(d)), clean, corrupted, answers=answers)
    assert py["receivers"] == [e["receiver"] for e in j["edges"]]
    assert np.array_equal(py["exact"], np.array([e["exact"] for e in j["edges"]]))
    # with a task instead (the default): a Hugging Face model has none, and the refusal names the probe
    line = bad_line(run("edges", "--checkpoint", d, "--rows", 3, "--threads", 2, "--out", tmp_path / "e2"))
    assert line.endswith(f"{d}: a Hugging Face model has no task to draw rows from (its vocabulary of 29 tokens does "
                         "not fit task copy); give --data probe"), line
    assert not (tmp_path / "e2").exists()


@pytest.mark.parametrize("command,instead", [
    (["patch"], "--data probe"), (["detect", "--data", "task"], "--data probe"), (["dla"], "--tokens or --text (one sequence)"),
    (["attn"], "--tokens"), (["grads"], "--batch FILE"),
    (["sae", "--hook", "blocks.0.hook_resid_post"], None)])
def test_a_command_that_needs_a_task_names_what_it_takes_on_an_hf_dir(tmp_path, command, instead):
    # a pretrained model has no task: each command names the input it takes instead, in one line;
    # nothing written. A headlab checkpoint of another task keeps the message about --task.
    d, _, _ = make(tmp_path, "smollm2")
    line = bad_line(run(*command, "--checkpoint", d, "--threads", 1, "--out", tmp_path / "out"))
    tail = f"give {instead}" if instead else "this command draws its rows from a task: give a model trained on one of headlab's tasks"
    assert line == (f"headlab: error: {d}: a Hugging Face model has no task to draw rows from (its vocabulary of 29 "
                    f"tokens does not fit task copy); {tail}"), line
    assert not (tmp_path / "out").exists()
    ck = tmp_path / "model.safetensors"
    assert run("convert", d, "--out", ck).returncode == 0
    line = bad_line(run(*command, "--checkpoint", ck, "--threads", 1, "--out", tmp_path / "out"))
    assert "does not fit task copy with alphabet 10 (13); give --task with the task the model was trained on" in line, line


@pytest.mark.parametrize("command", ["patch", "edges"])
def test_patch_and_edges_refuse_work_larger_than_memory_with_the_estimate(tmp_path, command):
    # a million rows of 65536 tokens (hundreds of GiB even though patch and edges run
    # chunks of rows and hold little per row): refused before the rows are made, naming the
    # estimate and the flags that lower it; nothing written
    d, _, _ = make(tmp_path, "smollm2", config={"max_position_embeddings": 65536})
    line = bad_line(run(command, "--checkpoint", d, "--data", "probe", "--length", 32768, "--examples", 1000000, "--threads", 2,
                        "--out", tmp_path / "out"))
    m = re.search(rf"^headlab: error: {command}: 1000000 sequences of 65536 tokens needs about ([\d.]+) (GiB|TiB|PiB|EiB) of memory, "
                  r"more than the .* available; lower --examples or --length$", line)
    assert m, line
    assert not (tmp_path / "out").exists()


# Forks and execs argv[1:] from a fresh interpreter and prints its exit code and peak RSS (wait4):
# Linux carries the exec-ing process's own peak into the command's, so this test's process (with
# PyTorch loaded) cannot start the command itself.
FRESH_PEAK_RSS = """import os, sys
pid = os.fork()
if pid == 0:
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1), os.dup2(null, 2)
    os.execv(sys.argv[1], sys.argv[1:])
_, status, usage = os.wait4(pid, 0)
print(os.waitstatus_to_exitcode(status), usage.ru_maxrss * 1024)"""


def peak_rss(*args):
    """(returncode, peak RSS in bytes) of one headlab command."""
    r = subprocess.run([sys.executable, "-c", FRESH_PEAK_RSS, HEADLAB, *map(str, args)], capture_output=True, text=True)
    rc, peak = map(int, r.stdout.split())
    return rc, peak


def test_a_bf16_load_peaks_near_the_float32_parameters_alone(tmp_path):
    # a BF16 model of a large vocabulary, 8 layers and 32768 positions: the load holds the file's
    # tensors as stored and widens each straight into its parameter, and the layers share one rotary
    # table, so the command's peak, over that of the same command on a tiny model, stays within the
    # float32 parameters + the largest tensor's BF16 bytes + one rotary table + 32 MiB of allocator
    # and page-table slack. (Widening every tensor first, a float32 copy on the way into each
    # parameter and a table per layer came to about 1.5 times the parameters.)
    V, D, L, Fi, P, dh = 65536, 256, 8, 256, 32768, 64
    d, _, _ = make(tmp_path, "smollm2", dtype=torch.bfloat16,
                   config={"vocab_size": V, "hidden_size": D, "num_hidden_layers": L, "intermediate_size": Fi,
                           "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": P})
    tiny, _, _ = make(tmp_path, "smollm2")
    Hkv = 2 * dh
    params = 2 * V * D + L * (2 * D + D * D + 2 * Hkv * D + D * D + 3 * Fi * D) + D  # the unembedding is its own matrix
    rc, base = peak_rss("dla", "--checkpoint", tiny, "--tokens", "1 2", "--threads", 1, "--out", tmp_path / "tiny")
    assert rc == 0
    rc, peak = peak_rss("dla", "--checkpoint", d, "--tokens", "1 2", "--threads", 1, "--out", tmp_path / "big")
    assert rc == 0
    bound = 4 * params + 2 * V * D + 4 * P * dh + (32 << 20)
    assert peak - base <= bound, ((peak - base) / 2 ** 20, bound / 2 ** 20)
