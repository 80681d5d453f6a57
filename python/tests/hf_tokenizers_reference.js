// The tokenizers library's own encode/decode (its Node binding @anush008/tokenizers) of texts with
// a tokenizer.json: node hf_tokenizers_reference.js MODULE_DIR tokenizer.json texts.json
// prints [{ids, plain, decoded}] per text: ids with add_special_tokens, plain without, and the
// decode of plain.
const { Tokenizer } = require(process.argv[2]);
const fs = require('fs');
const tok = Tokenizer.fromFile(process.argv[3]);
const texts = JSON.parse(fs.readFileSync(process.argv[4], 'utf-8'));
(async () => {
  const out = [];
  for (const t of texts) {
    const ids = (await tok.encode(t, null, { addSpecialTokens: true })).getIds();
    const plain = (await tok.encode(t, null, { addSpecialTokens: false })).getIds();
    out.push({ ids, plain, decoded: await tok.decode(plain, false) });
  }
  const decoded = [];
  for (const ids of process.argv[5] ? JSON.parse(fs.readFileSync(process.argv[5], 'utf-8')) : []) decoded.push(await tok.decode(ids, false));
  process.stdout.write(JSON.stringify({ texts: out, decoded }));
})().catch((e) => { console.error(String(e)); process.exit(1); });
